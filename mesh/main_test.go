package mesh_test

import (
	"testing"

	"github.com/sm-supervisor/sm/internal/testenv"
)

// TestMain builds nats-server from its Go module: the integration tests run
// real servers, which testenv checks are gone at the end.
func TestMain(m *testing.M) { testenv.Main(m, "github.com/nats-io/nats-server/v2") }
