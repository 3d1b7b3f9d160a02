package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/sm-supervisor/sm/ipc"
)

// Codes of errors sm-api raises itself. Errors from the manager (and from the
// bot, for a forwarded op) keep their own code; see statusOf.
const (
	CodeUnauthorized     = "unauthorized"
	CodeBadRequest       = "bad_request"
	CodeBodyTooLarge     = "body_too_large"
	CodeNotFound         = "not_found"
	CodeMethodNotAllowed = "method_not_allowed"
)

// Error is an HTTP API error: the status it is sent with and the
// {"error":{"code","message"}} body.
type Error struct {
	Status  int
	Code    string
	Message string
}

// Error renders the code and message, for logs.
func (e *Error) Error() string { return e.Code + ": " + e.Message }

// errorf builds an *Error.
func errorf(status int, code, format string, args ...any) *Error {
	return &Error{Status: status, Code: code, Message: fmt.Sprintf(format, args...)}
}

// badRequest is the common 400.
func badRequest(format string, args ...any) *Error {
	return errorf(http.StatusBadRequest, CodeBadRequest, format, args...)
}

// statusOf maps a protocol error code to an HTTP status. The codes are the
// protocol's stable ones; any other code is the bot's own, from a forwarded op
// it refused: that is the caller's request refused, hence 422.
func statusOf(code string) int {
	switch code {
	case ipc.CodeBadFrame:
		return http.StatusBadRequest
	case ipc.CodeForbidden:
		return http.StatusForbidden
	case ipc.CodeUnknownTarget, ipc.CodeUnknownOp:
		return http.StatusNotFound
	case ipc.CodeDeployInProgress:
		return http.StatusConflict
	case ipc.CodeFrameTooLarge:
		return http.StatusRequestEntityTooLarge
	case ipc.CodeBadConfig:
		return http.StatusUnprocessableEntity
	case ipc.CodeBusy:
		return http.StatusTooManyRequests
	case ipc.CodeUnavailable, ipc.CodeShuttingDown, ipc.CodeNotRegistered:
		return http.StatusServiceUnavailable
	case ipc.CodeTimeout:
		return http.StatusGatewayTimeout
	case ipc.CodeInternal, ipc.CodeUnknownID:
		return http.StatusInternalServerError
	default:
		return http.StatusUnprocessableEntity
	}
}

// asError turns any error of a handler into the *Error sent for it.
func asError(err error) *Error {
	var ae *Error
	var pe *ipc.Error
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.As(err, &pe):
		return &Error{Status: statusOf(pe.Code), Code: pe.Code, Message: pe.Message}
	case errors.As(err, &mbe):
		return errorf(http.StatusRequestEntityTooLarge, CodeBodyTooLarge, "request body exceeds api.max_body_bytes (%d)", mbe.Limit)
	case errors.Is(err, ipc.ErrFrameTooLarge):
		return errorf(http.StatusRequestEntityTooLarge, ipc.CodeFrameTooLarge, "request exceeds the manager's limits.max_frame_bytes")
	case errors.Is(err, ipc.ErrUnavailable), errors.Is(err, ipc.ErrClosed), errors.Is(err, ipc.ErrQueueFull):
		return errorf(http.StatusServiceUnavailable, ipc.CodeUnavailable, "not connected to the manager")
	case errors.Is(err, ipc.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		return errorf(http.StatusGatewayTimeout, ipc.CodeTimeout, "the manager did not answer in time")
	case errors.Is(err, context.Canceled):
		// The client went away or the server is shutting down; the status
		// is seldom read by anyone.
		return errorf(http.StatusServiceUnavailable, ipc.CodeUnavailable, "request cancelled")
	default:
		return errorf(http.StatusInternalServerError, ipc.CodeInternal, "%v", err)
	}
}
