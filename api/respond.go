package api

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
)

// writeJSON sends v as the JSON body with status. HTML is not escaped: this
// is an API, and "<token>" reads better than "\u003ctoken\u003e".
func writeJSON(w http.ResponseWriter, status int, v any) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		writeError(w, errorf(http.StatusInternalServerError, "internal", "encode response: %v", err))
		return
	}
	writeRaw(w, status, bytes.TrimSuffix(buf.Bytes(), []byte{'\n'}))
}

// writeRaw sends b, which is JSON already (a payload from the manager, passed
// through byte for byte), with status.
func writeRaw(w http.ResponseWriter, status int, b []byte) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	w.Write(b)
	w.Write([]byte{'\n'})
}

// writeError sends e as {"error":{"code","message"}}. A 401 names the scheme
// the client should use; a 429 or 503 tells it when to come back.
func writeError(w http.ResponseWriter, e *Error) {
	h := w.Header()
	switch e.Status {
	case http.StatusUnauthorized:
		if h.Get("WWW-Authenticate") == "" {
			h.Set("WWW-Authenticate", `Bearer realm="sm-api"`)
		}
	case http.StatusTooManyRequests, http.StatusServiceUnavailable:
		h.Set("Retry-After", "1")
	}
	writeJSON(w, e.Status, errorBody{Error: errorObject{Code: e.Code, Message: e.Message}})
}

type errorBody struct {
	Error errorObject `json:"error"`
}

type errorObject struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}
