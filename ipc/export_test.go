package ipc

// DecodeFast exposes decodeFast to the external tests.
var DecodeFast = decodeFast

// FastKeyHandled reports whether decodeFast decodes the key itself.
func FastKeyHandled(key string) bool { return fastKey([]byte(key)) != 0 }
