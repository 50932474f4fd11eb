package appliance

import (
	"net/http"

	"gpuhost/backend"
	"gpuhost/config"
	"gpuhost/internal/loopback"
)

// backendDialer reaches the backends: under systemd each profile port
// through its backend's unix socket (units.RenderProxyUnits; the backend
// has a private network), under the process runner over loopback TCP.
// Every daemon client that talks to a backend dials through it.
func backendDialer(cfg *config.Config) *loopback.Dialer {
	if cfg == nil {
		return &loopback.Dialer{}
	}
	return &loopback.Dialer{Sockets: cfg.BackendSockets()}
}

// backendClient is backend.NewClient through backendDialer.
func backendClient(cfg *config.Config) *http.Client {
	return backend.NewClientVia(backendDialer(cfg))
}
