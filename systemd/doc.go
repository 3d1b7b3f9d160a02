// Package systemd runs sm-manager as a systemd service: it speaks the
// sd_notify protocol (READY, STATUS, STOPPING and a watchdog that pings only
// while the manager's event loop turns), takes the sockets systemd passes by
// socket activation, and holds the unit files (*.service, *.socket) beside the
// Go code. Without systemd every part of it is a no-op.
//
// The rules, exactly:
//
//   - READY=1 is sent once, by Notifier.Report, from the first manager.Status
//     the event loop answers in which Started holds: every cluster has a live
//     process, or has failed to start at least once (its restart policy owns it
//     from then on). The loop answers only after Run has started the accept
//     loop and spawned every cluster, so by then the socket is serving.
//   - STATUS= is StatusLine of the newest Status, polled through the event
//     loop every StatusEvery (1s; every 20ms until READY=1), and sent only
//     when it changes; after Stopping it is StoppingLine instead.
//   - STOPPING=1 is sent by Stopping, which sm-manager calls the moment
//     SIGTERM or SIGINT arrives, before the clusters are quiesced.
//   - WATCHDOG=1 is sent at once, then every WATCHDOG_USEC/2, each time only
//     after a probe through the event loop (Manager.Status) came back. The
//     probe may take until WATCHDOG_USEC after the last ping; a wedged loop
//     means no pings, and systemd kills the manager WATCHDOG_USEC after the
//     last one (WatchdogSignal, SIGABRT: Go then prints every goroutine).
package systemd
