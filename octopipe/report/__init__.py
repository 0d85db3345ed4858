"""The report wing: figures (set-up and saving), the Chrome/Perfetto trace vocabulary and the
Markdown writer that every mode, experiment and benchmark uses for its pictures and reports."""
