// Package llm is the triage worker's use of an OpenAI-compatible endpoint
// (github.com/sashabaranov/go-openai): strict-schema classification with
// the schema checked again in code, and audio transcription.
package llm

import "time"

// Classification is the model's verdict; the JSON names are the schema's
// (classify.v1.schema.json).
type Classification struct {
	IsRealConversation bool   `json:"isRealConversation"`
	ContactType        string `json:"contactType"` // customer | prospect | lead | promotional | other
	Importance         int    `json:"importance"`  // 1..10
	Reasoning          string `json:"reasoning"`
}

// Usage is one model call's cost basis.
type Usage struct {
	Kind             string        `json:"kind"` // classification | transcription
	Model            string        `json:"model"`
	PromptTokens     int           `json:"prompt_tokens,omitempty"`
	CompletionTokens int           `json:"completion_tokens,omitempty"`
	AudioSeconds     float64       `json:"audio_seconds,omitempty"`
	Duration         time.Duration `json:"duration_ns"`
}

// Input is what the classifier sees of a mail.
type Input struct {
	From       string
	To         []string
	Subject    string
	Body       string // text, or text extracted from HTML
	Transcript string // voice memo transcript, if any
}

// Transcript is one transcribed attachment.
type Transcript struct {
	Filename string  `json:"filename"`
	Text     string  `json:"text"`
	Seconds  float64 `json:"seconds"` // audio duration as reported
}
