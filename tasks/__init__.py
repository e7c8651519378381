"""tffl data: loaders, client partitioning, synthetic generators and tasks (model + data).

Modules (import the one you need; none is imported here so `import tasks` stays cheap):
`partition`, `client_data`, `text_files`, `images`, `glue_tfds`, `text`, `synthetic`,
`subspace`, `task`, `benchmark_text`. See docs/tasks.md.
"""
