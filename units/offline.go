package units

import (
	"fmt"
	"strings"
)

// A backend unit runs with PrivateNetwork=yes unless its backend opens it
// (backends.<kind>.network: open). Without a network the servers must be
// told so: vLLM resolves its model through the Hugging Face hub at start even
// when the weights are cached, and without HF_HUB_OFFLINE it fails with
// connection errors or waits on timeouts. The settings below are that
// telling; EnvFile writes them for every profile that does not opt out, and
// RenderBackendUnit puts them into a fenced unit itself.

// Network is how a backend unit or a profile stands to the network.
type Network string

// The network settings. A unit is fenced (the default) or open; a profile
// is offline (the default: the offline settings are set) or open (they are
// not, which only an open unit allows).
const (
	NetworkFenced  Network = "fenced"
	NetworkOpen    Network = "open"
	NetworkOffline Network = "offline"
)

// EnvVar is one NAME=value of a backend's environment.
type EnvVar struct{ Name, Value string }

// String is NAME=value.
func (e EnvVar) String() string { return e.Name + "=" + e.Value }

// OfflineEnv is what tells a backend it has no network, in the order it is
// written:
//
//   - vLLM: HF_HUB_OFFLINE=1 (huggingface_hub resolves the model from the
//     cache only), TRANSFORMERS_OFFLINE=1 (the same for transformers'
//     tokenizer and config loading), VLLM_NO_USAGE_STATS=1 and DO_NOT_TRACK=1
//     (no usage report, which would wait on a network that is not there).
//   - Ollama: OLLAMA_NO_CLOUD=1 (no cloud models, which are served through
//     the local API but answered by ollama.com) and DO_NOT_TRACK=1. Ollama
//     resolves nothing at start, so nothing else is needed; OLLAMA_NOPRUNE is
//     not set: pruning unused blobs at start is local and unrelated.
func OfflineEnv(b Backend) []EnvVar {
	switch b {
	case VLLM:
		return []EnvVar{{"HF_HUB_OFFLINE", "1"}, {"TRANSFORMERS_OFFLINE", "1"}, {"VLLM_NO_USAGE_STATS", "1"}, {"DO_NOT_TRACK", "1"}}
	case Ollama:
		return []EnvVar{{"OLLAMA_NO_CLOUD", "1"}, {"DO_NOT_TRACK", "1"}}
	}
	return nil
}

// envTrue reads a switch the way huggingface_hub does (1, ON, YES, TRUE,
// in any case).
func envTrue(v string) bool {
	switch strings.ToUpper(strings.TrimSpace(v)) {
	case "1", "ON", "YES", "TRUE":
		return true
	}
	return false
}

// MissingOffline lists the names of b's OfflineEnv that getenv does not
// report switched on: empty when the backend knows it is offline.
func MissingOffline(b Backend, getenv func(string) string) []string {
	var missing []string
	for _, e := range OfflineEnv(b) {
		if !envTrue(getenv(e.Name)) {
			missing = append(missing, e.Name)
		}
	}
	return missing
}

// Offline reports whether the profile's backend is told it has no network
// (network unset or offline).
func (p Profile) Offline() bool { return p.Network != NetworkOpen }

// validateNetwork checks the profile's network: key.
func (p Profile) validateNetwork() string {
	switch p.Network {
	case "", NetworkOffline, NetworkOpen:
		return ""
	}
	return fmt.Sprintf("%q is not one of %s, %s", p.Network, NetworkOffline, NetworkOpen)
}
