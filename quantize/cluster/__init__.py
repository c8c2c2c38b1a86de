"""Where `quantize sweep` and `quantize search` run their tasks: a Ray cluster (connect.py), what each kind of task
asks of it (spec.py) and whether some node has that (resources.py), and the executor that submits a graph of tasks
and follows them (executor.py). It sits below sweep and search and imports neither: what a worker runs is a function
the caller hands the executor."""
