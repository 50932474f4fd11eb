package connector

import (
	"bytes"
	"fmt"

	"gopkg.in/yaml.v3"
)

// decodeStrict re-encodes node and decodes it with KnownFields, so a typo
// in a connector's section is an error, not a silent default.
func decodeStrict(node *yaml.Node, v any) error {
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	if err := enc.Encode(node); err != nil {
		return fmt.Errorf("re-encode: %w", err)
	}
	dec := yaml.NewDecoder(&buf)
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil {
		return err
	}
	return nil
}
