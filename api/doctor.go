package api

import "gpuhost/units"

// DoctorCheck is one finding of `gpuhost doctor`: stable id, severity, the
// measured value in the message, and what to do about it.
type DoctorCheck struct {
	ID       string         `json:"id"`
	Severity units.Severity `json:"severity"`
	Profile  string         `json:"profile,omitempty"`
	Message  string         `json:"message"`
	Fix      string         `json:"fix,omitempty"`
	Value    string         `json:"value,omitempty"`
}

// The values of DoctorReport.Exit: the contract's 0 (ok) and 1 (the
// command ran and found a problem).
const (
	DoctorExitOK   = 0
	DoctorExitFail = 1
)

// DoctorReport is the whole run.
type DoctorReport struct {
	Checks []DoctorCheck `json:"checks"`
	Worst  string        `json:"worst"`
	// Exit is the status `gpuhost doctor` ends with for this report, in
	// the one exit-code contract: DoctorExitOK when every check is ok or
	// only warns (warnings are printed, not a failure), DoctorExitFail
	// when a check failed.
	Exit   int     `json:"exit"`
	TookMS float64 `json:"took_ms"`
}
