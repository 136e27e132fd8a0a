"""Pure text evidence shared by generation and scoring: sentences with offsets, stemmed content
terms, citation markers and claim support."""
