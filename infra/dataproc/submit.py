#!/usr/bin/env python3
"""Submit the ingestion job to Google Cloud Dataproc (a cluster job) or Dataproc Serverless (a batch).

Build the packed environment first (`infra/package.sh`), then, from the repository root:

    # A Dataproc cluster: upload, then submit a PySpark job (the cluster's image version read with GetCluster)
    python infra/dataproc/submit.py --config pipeline.yaml --gcs-prefix gs://my-bucket/ingest/prod \\
        --cluster etl-cluster --project my-project --region europe-west1

    # Dataproc Serverless: upload, then create a PySpark batch on runtime 3.0 (Spark 4.0)
    python infra/dataproc/submit.py --config pipeline.yaml --gcs-prefix gs://my-bucket/ingest/prod \\
        --serverless --project my-project --region europe-west1 --subnet default

    # Either, with --dry-run (a cluster also needs --image-version or --spark-version): print the request as
    # JSON and the uploads; no Google Cloud call at all.

The requests are the Dataproc API's own types (google-cloud-dataproc: `SubmitJobRequest` with a `PySparkJob`,
`CreateBatchRequest` with a `PySparkBatch`), which refuse a field the API does not have. The job runs as
`ingest_job.py --config <pipeline file name> --until-caught-up` with the packed environment as an archive and
`spark.jars.packages` = the jars of ingest.runtime.jars for the Spark of the cluster's image or the batch's
runtime (CLUSTER_IMAGE_SPARK, BATCH_RUNTIME_SPARK); a Spark the job cannot run is refused before anything is
uploaded. Needs the `gcp` extra (`pip install -e '.[gcp]'`). Secrets: infra/README.md, "Secrets".
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import sys
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

REPO_ROOT = Path(__file__).resolve().parents[2]
if importlib.util.find_spec("ingest") is None:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(REPO_ROOT))

from ingest.errors import ConfigError  # noqa: E402
from ingest.runtime.jars import check_spark, maven_packages  # noqa: E402
from ingest.runtime.submit import (  # noqa: E402
    check_distinct_names,
    env_references,
    job_arguments,
    plaintext_passwords,
    read_pipeline,
    secret_setting,
)

try:
    from google.cloud import dataproc_v1
except ImportError:
    sys.exit("infra/dataproc/submit.py needs the gcp extra: .venv/bin/pip install -c constraints.txt -e '.[gcp]'")

DEFAULT_ARCHIVE = REPO_ROOT / "dist" / "ingest-env.tar.gz"
DEFAULT_JOB = REPO_ROOT / "jobs" / "ingest_job.py"
ARCHIVE_ALIAS = "environment"
ARCHIVE_PYTHON = f"./{ARCHIVE_ALIAS}/bin/python"
BATCH_ID = re.compile(r"[a-z0-9-]{4,63}")
DEFAULT_RUNTIME = "3.0"
SERVERLESS_ONLY = {
    "runtime_version": "--runtime-version",
    "batch": "--batch",
    "container_image": "--container-image",
    "subnet": "--subnet",
    "service_account": "--service-account",
}

# The Spark of each Dataproc on Compute Engine image version (Dataproc image version list and release notes).
# Keyed by major.minor: `2.2-debian12` and `2.2.40-debian12` are both 2.2.
CLUSTER_IMAGE_SPARK = {"2.1": "3.3.x", "2.2": "3.5.x", "2.3": "3.5.x", "3.0": "4.0.x"}
# The Spark of each Dataproc Serverless runtime version (Serverless for Apache Spark runtime releases).
BATCH_RUNTIME_SPARK = {"1.1": "3.3.4", "1.2": "3.5.1", "2.1": "3.4.x", "2.2": "3.5.1", "2.3": "3.5.x", "3.0": "4.0.1"}


def minor_version(version: str) -> str:
    """`2.2` of an image or runtime version such as `2.2`, `2.2.40-debian12` or `3.0-ubuntu22`."""
    found = re.match(r"(\d+\.\d+)(?:[.-]|$)", version.strip())
    return found.group(1) if found else version


def choose_spark(kind: Literal["image", "runtime"], version: str | None, spark_version: str | None) -> str:
    """The Spark that will run the job: --spark-version, else the image's or runtime's. Refuses any the job
    cannot run, with the supported versions in the message."""
    what = "Dataproc image" if kind == "image" else "Dataproc Serverless runtime"
    if spark_version:
        spark = spark_version
    elif version is None:
        raise ConfigError("give --image-version (or --spark-version): the cluster's Spark decides the jars")
    else:
        known = (CLUSTER_IMAGE_SPARK if kind == "image" else BATCH_RUNTIME_SPARK).get(minor_version(version))
        if known is None:
            raise ConfigError(
                f"{what} {version!r} is not one this tool knows the Spark version of; give --spark-version X.Y.Z"
            )
        spark = known
    try:
        check_spark(spark)
    except ConfigError as e:
        if version and not spark_version:
            raise ConfigError(f"{what} {version}: {e}") from None
        raise
    return spark


# --------------------------------------------------------------------------------------------------
# The requests


def parse_gcs_uri(uri: str) -> tuple[str, str]:
    """`gs://bucket/some/prefix/` into ("bucket", "some/prefix")."""
    match = re.fullmatch(r"gs://([a-z0-9][a-z0-9._-]*[a-z0-9])(?:/(.*))?", uri)
    if match is None:
        raise ValueError(f"--gcs-prefix must be gs://bucket[/prefix], got {uri!r}")
    return match.group(1), (match.group(2) or "").strip("/")


@dataclass(frozen=True)
class Artifacts:
    """The files the job needs, and where they go in Cloud Storage."""

    archive: Path | None
    """The packed environment; None when the cluster or container image already has the project."""
    job: Path
    config: Path
    bucket: str
    key_prefix: str

    def key(self, path: Path) -> str:
        return f"{self.key_prefix}/{path.name}" if self.key_prefix else path.name

    def uri(self, path: Path) -> str:
        return f"gs://{self.bucket}/{self.key(path)}"

    @property
    def files(self) -> list[Path]:
        return [p for p in (self.archive, self.job, self.config) if p is not None]

    @property
    def uploads(self) -> list[tuple[Path, str]]:
        return [(p, self.key(p)) for p in self.files]

    @property
    def archive_uris(self) -> list[str]:
        return [f"{self.uri(self.archive)}#{ARCHIVE_ALIAS}"] if self.archive else []


def plan_artifacts(
    gcs_prefix: str, config: Path, archive: Path | None = DEFAULT_ARCHIVE, job: Path = DEFAULT_JOB
) -> Artifacts:
    bucket, key_prefix = parse_gcs_uri(gcs_prefix)
    check_distinct_names(archive, job, config)
    return Artifacts(archive=archive, job=job, config=config, bucket=bucket, key_prefix=key_prefix)


def check_properties(items: Sequence[str]) -> dict[str, str]:
    """Extra `KEY=VALUE` Spark properties; refuses keys that would put a secret into the job or batch."""
    properties = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key or any(c.isspace() for c in key):
            raise ValueError(f"--property takes KEY=VALUE, got {item!r}")
        if secret_setting(key):
            raise ValueError(
                f"--property {key}=... would put a secret into the job's properties, readable by anyone who can "
                "view it; see infra/README.md (Secrets)"
            )
        properties[key] = value
    return properties


def spark_properties(art: Artifacts, spark_version: str, extra: Mapping[str, str], cluster: bool) -> dict[str, str]:
    properties = {}
    if cluster:
        # Cluster deploy mode: the driver runs in a YARN container, where the archive and the pipeline file are.
        properties["spark.submit.deployMode"] = "cluster"
    if art.archive:
        properties["spark.pyspark.python"] = ARCHIVE_PYTHON
    properties["spark.jars.packages"] = maven_packages(spark_version)
    return {**properties, **extra}


def build_job_request(
    art: Artifacts, project: str, region: str, cluster: str, spark_version: str, extra: Mapping[str, str] | None = None
) -> dataproc_v1.SubmitJobRequest:
    """`JobController.SubmitJob`: a PySpark job on a cluster."""
    pyspark = dataproc_v1.PySparkJob(
        main_python_file_uri=art.uri(art.job),
        args=job_arguments(art.config),
        file_uris=[art.uri(art.config)],
        archive_uris=art.archive_uris,
        properties=spark_properties(art, spark_version, extra or {}, cluster=True),
    )
    job = dataproc_v1.Job(placement=dataproc_v1.JobPlacement(cluster_name=cluster), pyspark_job=pyspark)
    return dataproc_v1.SubmitJobRequest(project_id=project, region=region, job=job, request_id=str(uuid.uuid4()))


@dataclass(frozen=True)
class BatchOptions:
    """What a Serverless batch sets beyond the job itself."""

    runtime_version: str = DEFAULT_RUNTIME
    """The Serverless runtime (RuntimeConfig.version); it decides the Spark version."""
    batch_id: str = ""
    """The batch's ID; empty lets the service choose one."""
    container_image: str = ""
    """A custom container image with the project installed (then without the archive)."""
    subnet: str = ""
    """The VPC subnetwork the batch runs in (needs a route to MySQL and to Maven Central)."""
    service_account: str = ""
    """The service account the batch runs as."""


def build_batch_request(
    art: Artifacts,
    project: str,
    region: str,
    spark_version: str,
    options: BatchOptions | None = None,
    extra: Mapping[str, str] | None = None,
) -> dataproc_v1.CreateBatchRequest:
    """`BatchController.CreateBatch`: a PySpark batch on Dataproc Serverless."""
    options = options or BatchOptions()
    pyspark = dataproc_v1.PySparkBatch(
        main_python_file_uri=art.uri(art.job),
        args=job_arguments(art.config),
        file_uris=[art.uri(art.config)],
        archive_uris=art.archive_uris,
    )
    runtime = dataproc_v1.RuntimeConfig(
        version=options.runtime_version,
        container_image=options.container_image,
        properties=spark_properties(art, spark_version, extra or {}, cluster=False),
    )
    execution = dataproc_v1.ExecutionConfig(service_account=options.service_account, subnetwork_uri=options.subnet)
    batch = dataproc_v1.Batch(
        pyspark_batch=pyspark,
        runtime_config=runtime,
        environment_config=dataproc_v1.EnvironmentConfig(execution_config=execution),
    )
    return dataproc_v1.CreateBatchRequest(
        parent=f"projects/{project}/locations/{region}",
        batch=batch,
        batch_id=options.batch_id,
        request_id=str(uuid.uuid4()),
    )


def to_json(request: dataproc_v1.SubmitJobRequest | dataproc_v1.CreateBatchRequest) -> str:
    """The request as the API's JSON (what `from_json` reads back), without fields left at their defaults."""
    return str(type(request).to_json(request, always_print_fields_with_no_presence=False))


# --------------------------------------------------------------------------------------------------
# Google Cloud calls (never made with --dry-run)


class DataprocApi(Protocol):
    """The calls the tool makes; `GoogleCloud` makes them, tests record them."""

    def get_cluster(self, request: dataproc_v1.GetClusterRequest) -> dataproc_v1.Cluster: ...

    def upload(self, path: Path, bucket: str, key: str) -> None: ...

    def submit_job(self, request: dataproc_v1.SubmitJobRequest) -> str: ...

    def create_batch(self, request: dataproc_v1.CreateBatchRequest) -> str: ...


class GoogleCloud:
    """The Dataproc API at the region's endpoint and Cloud Storage, with Application Default Credentials."""

    def __init__(self, project: str, region: str) -> None:
        self.project = project
        self.client_options = {"api_endpoint": f"{region}-dataproc.googleapis.com:443"}

    def get_cluster(self, request: dataproc_v1.GetClusterRequest) -> dataproc_v1.Cluster:
        return dataproc_v1.ClusterControllerClient(client_options=self.client_options).get_cluster(request=request)

    def upload(self, path: Path, bucket: str, key: str) -> None:
        from google.cloud import storage  # type: ignore[attr-defined]

        storage.Client(project=self.project).bucket(bucket).blob(key).upload_from_filename(str(path))

    def submit_job(self, request: dataproc_v1.SubmitJobRequest) -> str:
        job = dataproc_v1.JobControllerClient(client_options=self.client_options).submit_job(request=request)
        return f"submitted job {job.reference.job_id} to cluster {job.placement.cluster_name}"

    def create_batch(self, request: dataproc_v1.CreateBatchRequest) -> str:
        operation = dataproc_v1.BatchControllerClient(client_options=self.client_options).create_batch(request=request)
        return f"creating batch: operation {operation.operation.name}"


def cluster_image_version(api: DataprocApi, project: str, region: str, cluster: str) -> str:
    """The image version a running cluster was created with (GetCluster)."""
    request = dataproc_v1.GetClusterRequest(project_id=project, region=region, cluster_name=cluster)
    version = str(api.get_cluster(request).config.software_config.image_version)
    if not version:
        raise ConfigError(f"cluster {cluster} names no image version (a custom image?); give --spark-version X.Y.Z")
    return version


# --------------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="infra/dataproc/submit.py",
        description="Upload the packed job and run it on a Dataproc cluster (a job) or Dataproc Serverless (a batch).",
        epilog="Secrets are never part of the job or batch; see infra/README.md.",
    )
    parser.add_argument("--config", required=True, type=Path, help="the pipeline YAML file")
    parser.add_argument("--gcs-prefix", required=True, help="gs://bucket/prefix to upload the job's files to")
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--cluster", help="the Dataproc cluster to submit the job to (YARN, cluster deploy mode)")
    target.add_argument("--serverless", action="store_true", help="create a Dataproc Serverless batch")
    parser.add_argument(
        "--project",
        default=os.environ.get("GOOGLE_CLOUD_PROJECT"),
        help="Google Cloud project (default: $GOOGLE_CLOUD_PROJECT)",
    )
    parser.add_argument("--region", required=True, help="Dataproc region, e.g. europe-west1")
    parser.add_argument(
        "--image-version",
        help="cluster: its image version, e.g. 3.0-debian12; it decides the Spark version and so the jars "
        "(default: read with GetCluster; required with --dry-run)",
    )
    parser.add_argument(
        "--runtime-version",
        help=f"Serverless: the runtime version; it decides the Spark version (default {DEFAULT_RUNTIME}, Spark 4.0)",
    )
    parser.add_argument(
        "--spark-version",
        metavar="X.Y.Z",
        help="the Spark the job runs on, overriding the image's or runtime's (needed for one this tool does not know)",
    )
    parser.add_argument("--batch", default="", help="Serverless: the batch ID (default: the service picks one)")
    parser.add_argument("--container-image", default="", help="Serverless: a custom container image")
    parser.add_argument("--subnet", default="", help="Serverless: the VPC subnetwork (name or URI)")
    parser.add_argument("--service-account", default="", help="Serverless: the service account the batch runs as")
    parser.add_argument("--dry-run", action="store_true", help="print the request JSON; upload and call nothing")
    parser.add_argument("--archive", type=Path, default=DEFAULT_ARCHIVE, help="packed environment (infra/package.sh)")
    parser.add_argument(
        "--no-archive",
        action="store_true",
        help="ship no environment: the container image (--container-image) or the cluster already has the project",
    )
    parser.add_argument("--job", type=Path, default=DEFAULT_JOB, help="the spark-submit entry point")
    parser.add_argument(
        "--property",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra Spark property (repeatable; never a secret: properties are readable by job viewers)",
    )
    return parser


def main(argv: Sequence[str] | None = None, api: DataprocApi | None = None) -> int:
    """Run the tool; `api` stands in for Google Cloud (tests)."""
    parser = _parser()
    args = parser.parse_args(argv)
    if not args.project:
        parser.error("--project is required (or set GOOGLE_CLOUD_PROJECT)")
    if args.cluster:
        given = [flag for name, flag in SERVERLESS_ONLY.items() if getattr(args, name)]
        if given:
            parser.error(f"{', '.join(given)}: for --serverless; a cluster has its own")
        if args.dry_run and not (args.image_version or args.spark_version):
            parser.error("--dry-run calls nothing, so a cluster needs --image-version (or --spark-version)")
    elif args.image_version:
        parser.error("--image-version is for --cluster; a Serverless batch has --runtime-version")
    if args.batch and not BATCH_ID.fullmatch(args.batch):
        parser.error(f"--batch must be 4-63 lower-case letters, digits and hyphens, got {args.batch!r}")
    try:
        pipeline = read_pipeline(args.config)
        archive = None if args.no_archive else args.archive
        art = plan_artifacts(args.gcs_prefix, args.config, archive, args.job)
        extra = check_properties(args.property)
    except ValueError as e:
        parser.error(str(e))

    for key in plaintext_passwords(pipeline):
        print(
            f"WARNING: {args.config}: `{key}` is a plain-text password; it would be copied to Cloud Storage as is, "
            "and the job refuses it. Use {env: NAME} or {file: PATH} (infra/README.md, Secrets).",
            file=sys.stderr,
        )
    needed = env_references(pipeline)
    if needed:
        print(f"note: the driver needs these environment variables: {', '.join(needed)}", file=sys.stderr)

    cloud = api or GoogleCloud(args.project, args.region)
    request: dataproc_v1.SubmitJobRequest | dataproc_v1.CreateBatchRequest
    try:
        # The image or runtime decides the Spark, hence the jars; one the job cannot run stops here, before any upload.
        if args.cluster:
            image = args.image_version
            if image is None and not args.spark_version:
                image = cluster_image_version(cloud, args.project, args.region, args.cluster)
            spark = choose_spark("image", image, args.spark_version)
            source = f"image {image}"
            request = build_job_request(art, args.project, args.region, args.cluster, spark, extra)
        else:
            runtime = args.runtime_version or DEFAULT_RUNTIME
            spark = choose_spark("runtime", runtime, args.spark_version)
            source = f"runtime {runtime}"
            options = BatchOptions(
                runtime_version=runtime,
                batch_id=args.batch,
                container_image=args.container_image,
                subnet=args.subnet,
                service_account=args.service_account,
            )
            request = build_batch_request(art, args.project, args.region, spark, options, extra)
    except ConfigError as e:
        parser.error(str(e))
    source = "--spark-version" if args.spark_version else source
    print(f"note: Spark {spark} ({source}): the jars built for it", file=sys.stderr)

    if args.dry_run:
        for path, key in art.uploads:
            print(f"dry run: would upload {path} -> gs://{art.bucket}/{key}", file=sys.stderr)
        print(to_json(request))
        return 0

    missing = [str(p) for p in art.files if not p.is_file()]
    if missing:
        parser.error(f"missing: {', '.join(missing)} (build the archive with infra/package.sh, or pass --no-archive)")
    for path, key in art.uploads:
        print(f"uploading {path} -> gs://{art.bucket}/{key}", file=sys.stderr)
        cloud.upload(path, art.bucket, key)
    if isinstance(request, dataproc_v1.SubmitJobRequest):
        print(cloud.submit_job(request))
    else:
        print(cloud.create_batch(request))
    return 0


if __name__ == "__main__":
    sys.exit(main())
