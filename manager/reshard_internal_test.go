package manager

import "testing"

func TestReshardDue(t *testing.T) {
	tests := []struct {
		running, recommended int
		ratio                float64
		want                 bool
	}{
		{16, 16, 1, false},
		{16, 17, 1, true},    // ratio 1: every growth
		{16, 23, 1.5, false}, // 1.44x
		{16, 24, 1.5, true},  // exactly the ratio
		{16, 40, 1.5, true},
		{16, 8, 1, false},  // shrinking never reshards
		{1, 2, 2, true},    //
		{4, 5, 1.25, true}, // 1.25x
		{4, 5, 1.26, false},
	}
	for _, tt := range tests {
		if got := reshardDue(tt.running, tt.recommended, tt.ratio); got != tt.want {
			t.Errorf("reshardDue(%d, %d, %v) = %v, want %v", tt.running, tt.recommended, tt.ratio, got, tt.want)
		}
	}
}
