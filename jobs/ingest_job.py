"""spark-submit entry point: `spark-submit [spark options] jobs/ingest_job.py run --config pipeline.yaml`.

It takes the same arguments as the `ingest` command; Spark's master, jars and resources come from
spark-submit (see infra/README.md), the pipeline's `spark.master` is ignored there.
"""

import sys

from ingest.cli import main

if __name__ == "__main__":
    args = sys.argv[1:]
    # `jobs/ingest_job.py --config X` is short for `run --config X`.
    if args and args[0].startswith("--") and args[0] not in ("--help", "--log-level"):
        args = ["run", *args]
    sys.exit(main(args))
