"""What arrives as files: text out of documents (`documents`), transcription of voice."""
