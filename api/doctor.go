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

// DoctorReport is the whole run; Exit is the CLI's exit status.
type DoctorReport struct {
	Checks []DoctorCheck `json:"checks"`
	Worst  string        `json:"worst"`
	Exit   int           `json:"exit"`
	TookMS float64       `json:"took_ms"`
}
