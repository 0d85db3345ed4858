"""The typed config schema: one frozen dataclass per config group.

Field docs, types and defaults live here and only here; YAML presets under conf/ override them.
`convert` turns a raw section into its dataclass once, with every range checked.
"""
