package ipc_test

import (
	"bytes"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/sm-supervisor/sm/ipc"
)

// readAll reads frames until an error other than ErrFrameTooLarge, recording
// each frame (as a string) or "<too large>".
func readAll(t *testing.T, r *ipc.Reader) ([]string, error) {
	t.Helper()
	var got []string
	for i := 0; ; i++ {
		if i > 1e6 {
			t.Fatal("reader does not stop")
		}
		b, err := r.ReadFrame()
		switch {
		case err == nil:
			got = append(got, string(b))
		case errors.Is(err, ipc.ErrFrameTooLarge):
			got = append(got, "<too large>")
		default:
			return got, err
		}
	}
}

func TestReader(t *testing.T) {
	const max = 20
	exact := strings.Repeat("x", max)
	over := strings.Repeat("y", max+1)
	huge := strings.Repeat("z", 50*max) // many buffer fills of a max+1 buffer
	tests := []struct {
		name    string
		in      string
		want    []string
		wantErr error
	}{
		{"empty stream", "", nil, io.EOF},
		{"one frame", `{"op":"a"}` + "\n", []string{`{"op":"a"}`}, io.EOF},
		{"several frames", "a\nb\nc\n", []string{"a", "b", "c"}, io.EOF},
		{"blank lines skipped", "\n\n  \n\t\r\na\n\r\n\nb\n", []string{"a", "b"}, io.EOF},
		{"CRLF kept for the decoder", "a\r\n", []string{"a\r"}, io.EOF},
		{"unicode space is not blank", "\u00a0\n", []string{"\u00a0"}, io.EOF},
		{"exactly max accepted", exact + "\n", []string{exact}, io.EOF},
		{"max+1 refused, next frame read", over + "\nnext\n", []string{"<too large>", "next"}, io.EOF},
		{"huge line skipped, next frame read", "a\n" + huge + "\nnext\n", []string{"a", "<too large>", "next"}, io.EOF},
		{"two oversized in a row", over + "\n" + huge + "\n" + exact + "\n", []string{"<too large>", "<too large>", exact}, io.EOF},
		{"EOF mid-frame", "a\n" + `{"op":"b"`, []string{"a"}, io.ErrUnexpectedEOF},
		{"EOF inside an oversized frame", "a\n" + huge, []string{"a"}, io.ErrUnexpectedEOF},
		{"EOF after trailing blanks is clean", "a\n  \t", []string{"a"}, io.EOF},
	}
	readers := []struct {
		name string
		wrap func(io.Reader) io.Reader
	}{
		{"whole", func(r io.Reader) io.Reader { return r }},
		{"one byte at a time", iotest.OneByteReader},
		{"half reads", iotest.HalfReader},
		{"data with EOF", iotest.DataErrReader},
	}
	for _, tt := range tests {
		for _, rd := range readers {
			t.Run(tt.name+"/"+rd.name, func(t *testing.T) {
				r := ipc.NewReader(rd.wrap(strings.NewReader(tt.in)), max)
				got, err := readAll(t, r)
				if !slices.Equal(got, tt.want) {
					t.Errorf("frames = %q, want %q", got, tt.want)
				}
				if err != tt.wantErr {
					t.Errorf("final error = %v, want %v", err, tt.wantErr)
				}
			})
		}
	}
}

// TestReaderLargeMax covers a limit above the 64 KiB read buffer, where a frame
// is put together from several buffer fills.
func TestReaderLargeMax(t *testing.T) {
	const max = 200 << 10
	exact := bytes.Repeat([]byte("e"), max)
	over := bytes.Repeat([]byte("o"), max+1)
	mid := bytes.Repeat([]byte("m"), 100<<10)
	var in bytes.Buffer
	for _, b := range [][]byte{exact, over, mid, []byte("tail")} {
		in.Write(b)
		in.WriteByte('\n')
	}
	r := ipc.NewReader(&in, max)
	for i, want := range [][]byte{exact, nil, mid, []byte("tail")} {
		got, err := r.ReadFrame()
		if want == nil {
			if !errors.Is(err, ipc.ErrFrameTooLarge) {
				t.Fatalf("frame %d: err = %v, want ErrFrameTooLarge", i, err)
			}
			continue
		}
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("frame %d: got %d bytes, err %v; want %d bytes", i, len(got), err, len(want))
		}
	}
	if _, err := r.ReadFrame(); err != io.EOF {
		t.Fatalf("after the last frame: err = %v, want EOF", err)
	}
}

// TestReaderResumesAfterError checks that a transient read error (a read
// deadline, say) in the middle of a line does not lose the line's start: the
// next ReadFrame continues it rather than returning its tail as a frame.
func TestReaderResumesAfterError(t *testing.T) {
	const max = 32
	tests := []struct {
		name string
		in   string
		want []string
	}{
		{"inside a frame", `{"op":"ping","id":"1"}` + "\nnext\n", []string{`{"op":"ping","id":"1"}`, "next"}},
		{"inside an oversized frame", strings.Repeat("q", 100) + "\nnext\n", []string{"<too large>", "next"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// flakyReader fails every third read: each error strikes mid-line.
			r := ipc.NewReader(&flakyReader{r: iotest.OneByteReader(strings.NewReader(tt.in)), every: 3}, max)
			var got []string
			errs := 0
			for {
				b, err := r.ReadFrame()
				if errors.Is(err, errFlaky) {
					errs++
					continue
				}
				if err == io.EOF {
					break
				}
				if errors.Is(err, ipc.ErrFrameTooLarge) {
					got = append(got, "<too large>")
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, string(b))
			}
			if errs == 0 {
				t.Fatal("the flaky reader never failed; the test proves nothing")
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("frames = %q, want %q", got, tt.want)
			}
		})
	}
}

var errFlaky = errors.New("transient read error")

type flakyReader struct {
	r     io.Reader
	every int
	n     int
}

func (f *flakyReader) Read(p []byte) (int, error) {
	f.n++
	if f.n%f.every == 0 {
		return 0, errFlaky
	}
	return f.r.Read(p)
}

// TestReaderTinyMax checks limits below bufio's 16-byte minimum buffer.
func TestReaderTinyMax(t *testing.T) {
	r := ipc.NewReader(strings.NewReader("abc\nabcd\nabcdefghijklmnopqrstuvwxyz\nab\n"), 3)
	got, err := readAll(t, r)
	want := []string{"abc", "<too large>", "<too large>", "ab"}
	if !slices.Equal(got, want) || err != io.EOF {
		t.Fatalf("frames = %q, err %v; want %q, EOF", got, err, want)
	}
}
