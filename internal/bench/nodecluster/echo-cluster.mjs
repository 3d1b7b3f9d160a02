// echo-cluster.mjs: the cluster process of `sm-bench route --node`, a Node
// bot's side of sm's routed echo written as a user of @sm-supervisor/client
// writes it (clients/node/README.md). sm-manager starts it with the SM_*
// environment; sm-bench's load client sends it echo requests through the
// manager. See docs/performance.md, "A Node cluster on @sm-supervisor/client".
//
// It imports the package from this repository's clients/node (the path a
// checkout has; `npm install /path/to/sm/clients/node` gives a bot the same
// files under the name @sm-supervisor/client), so nothing needs installing.

import { connect } from '../../../clients/node/src/index.js';

const sm = await connect();
sm.handle('echo', (p) => p);
// sm-bench's readiness probe, answered as cluster-harness answers it: the pid
// is where sm-bench reads this process's CPU time.
sm.handle('ping', () => ({ pid: process.pid }));
sm.setReady(true);
