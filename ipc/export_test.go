package ipc

// DecodeFast exposes decodeFast (without a Decoder) to the external tests.
func DecodeFast(b []byte) (*Frame, bool) { return decodeFast(b, nil) }

// FastKeyHandled reports whether decodeFast decodes the key itself.
func FastKeyHandled(key string) bool { return fastKey([]byte(key)) != 0 }
