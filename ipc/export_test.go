package ipc

// DecodeFast exposes decodeFast (without a Decoder) to the external tests.
func DecodeFast(b []byte) (*Frame, bool) { return decodeFast(b, nil) }

// FastKeyHandled reports whether decodeFast decodes the key itself.
func FastKeyHandled(key string) bool { return fastKey([]byte(key)) != 0 }

// Options returns the bounds of c.
func (c *Conn) Options() Options { return c.opts }

// Buffered reports how many read bytes wait in c's input buffer.
func (c *Conn) Buffered() int { return c.r.br.Buffered() }

// Queued returns the number of frames waiting to be written.
func (c *Conn) Queued() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.queued
}
