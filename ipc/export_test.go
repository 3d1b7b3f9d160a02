package ipc

// DecodeFast exposes decodeFast to the external tests.
var DecodeFast = decodeFast
