package simulator

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"weak"
)

// Faults a test can ask the simulator for, so clients that check model
// output (the triage worker) can be tested against a misbehaving model.
const (
	// SchemaFaultProse answers every structured-output request with prose,
	// as a model that ignores response_format would.
	SchemaFaultProse = "prose"
	// SchemaFaultInvalid answers with JSON that violates the schema (a
	// bounded integer such as importance 1–10 set to 42, else an unknown enum
	// value, else a required property missing, else the wrong type).
	SchemaFaultInvalid = "invalid"
	// SchemaFaultProseOnce answers the first structured-output request of
	// each simulator run with prose and later ones correctly, to exercise a
	// client's retry.
	SchemaFaultProseOnce = "prose-once"
	// TranscriptionFaultError makes /v1/audio/transcriptions answer 500.
	TranscriptionFaultError = "error"
)

// validateFaults checks the fault options; Options.withDefaults calls it.
func validateFaults(o Options) error {
	switch o.SchemaFault {
	case "", SchemaFaultProse, SchemaFaultInvalid, SchemaFaultProseOnce:
	default:
		return fmt.Errorf("simulator options: schema fault %q: want %q, %q, %q or none",
			o.SchemaFault, SchemaFaultProse, SchemaFaultInvalid, SchemaFaultProseOnce)
	}
	switch o.TranscriptionFault {
	case "", TranscriptionFaultError:
	default:
		return fmt.Errorf("simulator options: transcription fault %q: want %q or none", o.TranscriptionFault, TranscriptionFaultError)
	}
	if err := validateWakeFault(o.WakeFault); err != nil {
		return err
	}
	return validateToolCallFault(o.ToolCallFault)
}

// proseReply is the answer of a model that ignored response_format; it says
// where it comes from so nobody mistakes it for a model's words.
const proseReply = "Sure! This message looks like an ordinary conversation, and I would give it a medium importance. " +
	"(Simulated prose reply instead of JSON: --schema-fault.)"

// proseOnceUsed remembers per running server whether the one prose answer
// of SchemaFaultProseOnce was given. It is keyed weakly and the entry is
// dropped when the server is collected, so finished runs leave nothing.
var proseOnceUsed sync.Map // weak.Pointer[server] → *atomic.Bool

// takeProseOnce reports true exactly once per server.
func (s *server) takeProseOnce() bool {
	key := weak.Make(s)
	v, loaded := proseOnceUsed.LoadOrStore(key, new(atomic.Bool))
	if !loaded {
		runtime.AddCleanup(s, func(k weak.Pointer[server]) { proseOnceUsed.Delete(k) }, key)
	}
	return v.(*atomic.Bool).CompareAndSwap(false, true)
}

// fixedReply decides whether a chat request gets an exact reply instead of
// the filler words: a schema-valid JSON document for response_format
// json_schema (schema.go), "{}" for json_object. ok false means "no fixed
// reply"; an error is the flavour's 400 for a malformed response_format.
// The document is seeded by the user messages, so one mail always gets the
// same verdict and different mails get different ones.
func (s *server) fixedReply(req *oaiChatRequest, msgs []chatMessage) (text string, ok bool, e *apiError) {
	rf, e := decodeResponseFormat(req.ResponseFormat, s.opts.Flavor)
	if e != nil || rf == nil {
		return "", false, e
	}
	switch s.opts.SchemaFault {
	case SchemaFaultProse:
		return proseReply, true, nil
	case SchemaFaultProseOnce:
		if s.takeProseOnce() {
			return proseReply, true, nil
		}
	}
	if rf.kind == "json_object" {
		if s.opts.SchemaFault == SchemaFaultInvalid {
			return `["not","an","object"]`, true, nil
		}
		return "{}", true, nil
	}
	var user strings.Builder
	for _, m := range msgs {
		if m.Role == "user" {
			user.WriteString(m.Content)
			user.WriteByte('\n')
		}
	}
	out, doc := generateDocument(rf.schema, rf.strict, user.String())
	if s.opts.SchemaFault == SchemaFaultInvalid {
		out = violate(rf.schema, doc)
	}
	return string(out), true, nil
}
