package simulator

// fixedReply decides whether a chat request gets an exact reply instead of
// the filler words: a schema-valid JSON document for response_format
// json_schema (schema.go). ok false means "no fixed reply".
func (s *server) fixedReply(req *oaiChatRequest, msgs []chatMessage) (text string, ok bool, e *apiError) {
	return "", false, nil
}
