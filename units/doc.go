// Package units turns gpuhost profiles into what systemd runs and back again.
//
// It is pure: no D-Bus, no files, no GPU. Everything here is a function of
// its arguments so that the daemon, `gpuhost units`, `gpuhost doctor` and the
// tests all agree on one rendering:
//
//   - Profile (a named model setup from the YAML config) → backend argv
//     (VLLMArgs, SimArgs, BackendArgs) → the EnvironmentFile gpuhost writes per
//     switch (EnvFile) → the unit that expands it (RenderBackendUnit).
//   - A live vLLM command line (ExecStart or /proc/<pid>/cmdline) → flags
//     (ParseVLLMArgv) → what differs from the profile (Drift).
//   - The known-good settings rules for a GPU (Policy, ProfileChecks,
//     EstimateVRAM), which are code, not advice in a README.
//   - The gpuhost.service unit itself (RenderDaemonUnit), the drop-in that
//     adds mutual exclusion to an operator's own unit (RenderAdoptDropIn),
//     and a small parser for unit files (ParseUnitFile, SplitExecStart).
//
// Why the argv travels through an EnvironmentFile: switching a profile must
// not rewrite a unit file and daemon-reload on every switch; the unit stays
// fixed and says `ExecStart=<program> $GPUHOST_ARGS`, and gpuhost rewrites
// only the small environment file. systemd splits `$VAR` on whitespace (and
// unquotes), which is why Validate refuses whitespace, quotes and
// backslashes in anything that ends up in an argument.
package units
