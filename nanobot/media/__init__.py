"""What arrives as files: voice notes heard as text, documents read as text."""
