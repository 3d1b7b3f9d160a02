// @sm-supervisor/client: join an sm-manager fleet from Node.js or Bun over the
// manager's Unix socket (wire protocol v1, docs/protocol.md), with no bridge
// process and no dependencies.
//
//   connect(options)        a cluster process: REGISTER from the SM_* environment,
//                           heartbeats, handlers, requests, identify gate,
//                           ACTIVATE / QUIESCE, reconnection after a manager restart,
//                           exit 75 when orphaned in a mesh (SM_ORPHAN_TIMEOUT_MS)
//   connectClient(options)  a role client: requests, broadcast, STATUS, WATCH, DEPLOY
//   SmError                 every failure, with the protocol's stable `code`

export { connect, Cluster, ORPHAN_EXIT_CODE } from './cluster.js';
export { connectClient, Client } from './client.js';
export { SmError, Codes } from './errors.js';
export { DEFAULT_MAX_FRAME_BYTES } from './framing.js';
export { DEFAULT_REQUEST_TIMEOUT_MS, LOCAL_DEADLINE_GRACE_MS } from './peer.js';
