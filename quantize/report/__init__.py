"""The bytes-versus-accuracy report: collected from records and the cache (`collect`), drawn as
Markdown, HTML and plots (`render`). It never loads a model."""
