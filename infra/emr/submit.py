#!/usr/bin/env python3
"""Submit the ingestion job to Amazon EMR on EC2 (a cluster step) or EMR Serverless (a job run).

Build the packed environment first (`infra/package.sh`), then, from the repository root:

    # EMR on EC2: upload, then add a step to a running cluster (its release label read with DescribeCluster)
    python infra/emr/submit.py --config pipeline.yaml --s3-prefix s3://my-bucket/ingest/prod \\
        --cluster-id j-ABCDEFGHIJKL --region eu-west-1

    # EMR Serverless: upload, then start a job run (the application's label read with GetApplication)
    python infra/emr/submit.py --config pipeline.yaml --s3-prefix s3://my-bucket/ingest/prod \\
        --serverless-application-id 00abcdefghijklmn \\
        --execution-role-arn arn:aws:iam::123456789012:role/ingest-job \\
        --secret-env MYSQL_PASSWORD=prod/ingest/mysql-password --region eu-west-1

    # Either, with --dry-run and --release-label (or --spark-version): print the step (or job run) JSON and the
    # uploads; no AWS call at all.

It uploads `dist/ingest-env.tar.gz`, `jobs/ingest_job.py` and the pipeline file under the S3 prefix and runs
`spark-submit --deploy-mode cluster --archives <env>#environment --packages <jars for the release's Spark>
<prefix>/ingest_job.py --config <pipeline file name> --until-caught-up`.

The release label decides the Spark version (EMR_RUNTIMES), hence the Iceberg runtime jar
(ingest.runtime.jars); a release whose Spark the job cannot run is refused before anything is uploaded.
Every request is checked against botocore's model of the service before it is printed or sent.

Secrets never go into the step: the pipeline file holds only `{env: NAME}` / `{file: PATH}` references and
the values reach the driver from AWS Secrets Manager (infra/README.md, "Secrets"). `--secret-env NAME=ID`
(EMR Serverless) adds `spark.emr-serverless.driverEnv.NAME=EMR.secret@ID`: a reference that EMR Serverless
resolves when the job starts, not the value.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import re
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

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

DEFAULT_ARCHIVE = REPO_ROOT / "dist" / "ingest-env.tar.gz"
DEFAULT_JOB = REPO_ROOT / "jobs" / "ingest_job.py"
ARCHIVE_ALIAS = "environment"
ARCHIVE_PYTHON = f"./{ARCHIVE_ALIAS}/bin/python"
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

Service = Literal["s3", "emr", "emr-serverless"]
# boto3's `Session(region_name=...).client(service)`, or a stand-in that records the calls (tests).
ClientFactory = Callable[[Service], Any]


@dataclass(frozen=True)
class EmrRuntime:
    """A family of EMR release labels and the Spark they run."""

    label: re.Pattern[str]
    spark: str
    platform: str


# The Spark of each EMR release family (AWS EMR release guide: "Spark release history", and the
# emr-spark-8.0.0 release notes). A label not listed here is never guessed: --spark-version names its Spark.
EMR_RUNTIMES = (
    EmrRuntime(re.compile(r"emr-spark-8\.0\.0(-[0-9a-z]+)?"), "4.0.2", "EMR on EC2, EKS and Serverless 8.0"),
    EmrRuntime(re.compile(r"emr-7\.\d+\.\d+"), "3.5.x", "EMR 7.x"),
)


def label_spark(label: str) -> str | None:
    """The Spark version an EMR release label runs, or None for a label this tool does not know."""
    for runtime in EMR_RUNTIMES:
        if runtime.label.fullmatch(label):
            return runtime.spark
    return None


def choose_spark(release_label: str | None, spark_version: str | None) -> str:
    """The Spark that will run the job: --spark-version, else the release label's. Refuses any the job cannot run."""
    if spark_version:
        version = spark_version
    elif release_label is None:
        raise ConfigError("give --release-label (or --spark-version): the Spark of the release decides the jars")
    else:
        known = label_spark(release_label)
        if known is None:
            raise ConfigError(
                f"EMR release label {release_label!r} is not one this tool knows the Spark version of; give "
                "--spark-version X.Y.Z (the release's Spark, AWS EMR release guide: Spark release history)"
            )
        version = known
    try:
        check_spark(version)
    except ConfigError as e:
        if release_label and not spark_version:
            raise ConfigError(f"EMR release {release_label}: {e}") from None
        raise
    return version


# --------------------------------------------------------------------------------------------------
# The services' own API model (botocore's bundled service models), checked before a request is printed or sent.


class RequestRejected(ValueError):
    """A request the service would refuse, by its published API model."""


@functools.cache
def _service_model(service: Service) -> Any:
    import botocore.session

    return botocore.session.get_session().get_service_model(service)


def check_request(service: Service, operation: str, params: Mapping[str, Any]) -> None:
    """Validate `params` as botocore does before sending (members, types, required, min), and also against the
    model's max lengths, enums and patterns, which botocore leaves to the service."""
    from botocore.validate import ParamValidator

    shape = _service_model(service).operation_model(operation).input_shape
    report = ParamValidator().validate(params, shape)
    problems = [report.generate_report()] if report.has_errors() else []
    problems += list(_constraint_errors(params, shape, "input"))
    if problems:
        raise RequestRejected(f"{service} {operation} request does not fit the API model:\n" + "\n".join(problems))


@functools.cache
def _pattern(pattern: str) -> re.Pattern[str] | None:
    try:
        return re.compile(pattern, re.ASCII)
    except re.error:  # a Java-only construct (surrogate ranges): left to the service
        return None


def _constraint_errors(value: Any, shape: Any, where: str) -> Iterator[str]:
    kind, meta = shape.type_name, shape.metadata
    if "max" in meta:
        if isinstance(value, str | list | Mapping) and len(value) > meta["max"]:
            yield f"{where}: {len(value)} {'characters' if kind == 'string' else 'items'}, at most {meta['max']}"
        elif isinstance(value, int) and value > meta["max"]:
            yield f"{where}: {value}, at most {meta['max']}"
    if kind == "structure" and isinstance(value, Mapping):
        for key, member in shape.members.items():
            if key in value:
                yield from _constraint_errors(value[key], member, f"{where}.{key}")
    elif kind == "list" and isinstance(value, list):
        for i, item in enumerate(value):
            yield from _constraint_errors(item, shape.member, f"{where}[{i}]")
    elif kind == "map" and isinstance(value, Mapping):
        for key, item in value.items():
            yield from _constraint_errors(key, shape.key, f"{where} key {key!r}")
            yield from _constraint_errors(item, shape.value, f"{where}.{key}")
    elif kind == "string" and isinstance(value, str):
        if shape.enum and value not in shape.enum:
            yield f"{where}: {value!r} is not one of {', '.join(shape.enum)}"
        pattern = _pattern(meta["pattern"]) if "pattern" in meta else None
        if pattern is not None and not pattern.fullmatch(value):
            yield f"{where}: {value!r} does not match {meta['pattern']}"


def call(client: Any, service: Service, operation: str, params: dict[str, Any]) -> Mapping[str, Any]:
    """Send one request, checked against the model first."""
    from botocore import xform_name

    check_request(service, operation, params)
    response: Mapping[str, Any] = getattr(client, xform_name(operation))(**params)
    return response


# --------------------------------------------------------------------------------------------------
# The requests


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """`s3://bucket/some/prefix/` into ("bucket", "some/prefix")."""
    match = re.fullmatch(r"s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(?:/(.*))?", uri)
    if match is None:
        raise ValueError(f"not an S3 prefix: {uri!r} (expected s3://bucket/prefix)")
    return match.group(1), (match.group(2) or "").strip("/")


@dataclass(frozen=True)
class Artifacts:
    """The three files the job needs, and where they go in S3."""

    archive: Path
    job: Path
    config: Path
    bucket: str
    key_prefix: str

    def key(self, path: Path) -> str:
        return f"{self.key_prefix}/{path.name}" if self.key_prefix else path.name

    def uri(self, path: Path) -> str:
        return f"s3://{self.bucket}/{self.key(path)}"

    @property
    def uploads(self) -> list[tuple[Path, str]]:
        return [(p, self.key(p)) for p in (self.archive, self.job, self.config)]


def plan_artifacts(s3_prefix: str, config: Path, archive: Path = DEFAULT_ARCHIVE, job: Path = DEFAULT_JOB) -> Artifacts:
    bucket, key_prefix = parse_s3_uri(s3_prefix)
    check_distinct_names(archive, job, config)
    return Artifacts(archive=archive, job=job, config=config, bucket=bucket, key_prefix=key_prefix)


def check_conf(conf: Sequence[str]) -> list[tuple[str, str]]:
    """Extra `KEY=VALUE` Spark settings; refuses keys that would put a secret into the step."""
    pairs = []
    for item in conf:
        key, sep, value = item.partition("=")
        if not sep or not key or any(c.isspace() for c in item):
            raise ValueError(f"--conf takes KEY=VALUE without spaces, got {item!r}")
        if secret_setting(key):
            raise ValueError(
                f"--conf {key}=... would put a secret into the step, readable by anyone who can describe it; "
                "supply secrets from AWS Secrets Manager (infra/README.md, Secrets)"
            )
        pairs.append((key, value))
    return pairs


def spark_submit_args(art: Artifacts, spark_version: str, conf: Sequence[tuple[str, str]] = ()) -> list[str]:
    """The `spark-submit` command line of an EMR on EC2 step (YARN, cluster deploy mode)."""
    args = [
        "spark-submit",
        "--deploy-mode",
        "cluster",
        "--archives",
        f"{art.uri(art.archive)}#{ARCHIVE_ALIAS}",
        "--files",
        art.uri(art.config),
        "--conf",
        f"spark.pyspark.python={ARCHIVE_PYTHON}",
        "--packages",
        maven_packages(spark_version),
    ]
    for key, value in conf:
        args += ["--conf", f"{key}={value}"]
    return [*args, art.uri(art.job), *job_arguments(art.config)]


def build_emr_step(
    art: Artifacts,
    name: str,
    spark_version: str,
    action_on_failure: str = "CONTINUE",
    conf: Sequence[tuple[str, str]] = (),
) -> dict[str, Any]:
    """One element of `Steps` for `emr.add_job_flow_steps`."""
    return {
        "Name": name,
        "ActionOnFailure": action_on_failure,
        "HadoopJarStep": {"Jar": "command-runner.jar", "Args": spark_submit_args(art, spark_version, conf)},
    }


def build_serverless_job_run(
    art: Artifacts,
    application_id: str,
    execution_role_arn: str,
    name: str,
    spark_version: str,
    secret_env: Mapping[str, str] | None = None,
    conf: Sequence[tuple[str, str]] = (),
    client_token: str | None = None,
) -> dict[str, Any]:
    """The keyword arguments of `emr-serverless.start_job_run`, equivalent to the EMR on EC2 step."""
    settings = [
        ("spark.archives", f"{art.uri(art.archive)}#{ARCHIVE_ALIAS}"),
        ("spark.files", art.uri(art.config)),
        ("spark.jars.packages", maven_packages(spark_version)),
        ("spark.emr-serverless.driverEnv.PYSPARK_DRIVER_PYTHON", ARCHIVE_PYTHON),
        ("spark.emr-serverless.driverEnv.PYSPARK_PYTHON", ARCHIVE_PYTHON),
        ("spark.executorEnv.PYSPARK_PYTHON", ARCHIVE_PYTHON),
        *conf,
    ]
    request: dict[str, Any] = {
        "applicationId": application_id,
        # The model requires an idempotency token (boto3 would fill one in); set here, the request printed by a
        # dry run is the one that is sent.
        "clientToken": client_token or str(uuid.uuid4()),
        "executionRoleArn": execution_role_arn,
        "name": name,
        "jobDriver": {
            "sparkSubmit": {
                "entryPoint": art.uri(art.job),
                "entryPointArguments": job_arguments(art.config),
                "sparkSubmitParameters": " ".join(f"--conf {k}={v}" for k, v in settings),
            }
        },
    }
    if secret_env:
        # References, resolved by EMR Serverless from Secrets Manager when the job starts.
        properties = {f"spark.emr-serverless.driverEnv.{n}": f"EMR.secret@{ref}" for n, ref in secret_env.items()}
        request["configurationOverrides"] = {
            "applicationConfiguration": [{"classification": "spark-defaults", "properties": properties}]
        }
    return request


def parse_secret_env(items: Sequence[str]) -> dict[str, str]:
    result = {}
    for item in items:
        name, sep, ref = item.partition("=")
        if not sep or not ENV_NAME.fullmatch(name) or not ref or any(c.isspace() for c in ref):
            raise ValueError(f"--secret-env takes NAME=SECRET_ID (a Secrets Manager name or ARN), got {item!r}")
        result[name] = ref
    return result


# --------------------------------------------------------------------------------------------------
# AWS calls (never made with --dry-run)


def aws_clients(region: str | None) -> ClientFactory:
    def client(service: Service) -> Any:
        import boto3

        return boto3.session.Session(region_name=region).client(service)

    return client


def read_release_label(client: ClientFactory, cluster_id: str | None, application_id: str | None) -> str:
    """The release label of the cluster (DescribeCluster) or of the Serverless application (GetApplication)."""
    if cluster_id:
        cluster = call(client("emr"), "emr", "DescribeCluster", {"ClusterId": cluster_id})["Cluster"]
        label = cluster.get("ReleaseLabel")
    else:
        app = call(client("emr-serverless"), "emr-serverless", "GetApplication", {"applicationId": application_id})
        label = app["application"].get("releaseLabel")
    if not label:
        raise ConfigError(f"{cluster_id or application_id} has no release label; give --spark-version X.Y.Z")
    return str(label)


def upload(art: Artifacts, client: ClientFactory) -> None:
    s3 = client("s3")
    for path, key in art.uploads:
        print(f"uploading {path} -> s3://{art.bucket}/{key}", file=sys.stderr)
        s3.upload_file(Filename=str(path), Bucket=art.bucket, Key=key)


# --------------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="infra/emr/submit.py",
        description="Upload the packed job and run it on EMR on EC2 (a step) or EMR Serverless (a job run).",
        epilog="Secrets are never part of the step; see infra/README.md.",
    )
    parser.add_argument("--config", required=True, type=Path, help="the pipeline YAML file")
    parser.add_argument("--s3-prefix", required=True, help="s3://bucket/prefix to upload the job's files to")
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--cluster-id", help="EMR on EC2 cluster (j-...) to add the step to")
    target.add_argument("--serverless-application-id", help="EMR Serverless application to start the job run in")
    parser.add_argument("--execution-role-arn", help="EMR Serverless job runtime role (required with it)")
    parser.add_argument(
        "--release-label",
        help="the cluster's / application's EMR release label, e.g. emr-spark-8.0.0; it decides the Spark version "
        "and so the jars (default: read with DescribeCluster / GetApplication; required with --dry-run)",
    )
    parser.add_argument(
        "--spark-version",
        metavar="X.Y.Z",
        help="the Spark the job runs on, overriding the release label's (needed for a label this tool does not know)",
    )
    parser.add_argument("--region", help="AWS region (default: the AWS configuration's)")
    parser.add_argument("--dry-run", action="store_true", help="print the step/job run JSON; upload and call nothing")
    parser.add_argument("--name", help="step / job run name (default: ingest-<pipeline name>)")
    parser.add_argument("--archive", type=Path, default=DEFAULT_ARCHIVE, help="packed environment (infra/package.sh)")
    parser.add_argument("--job", type=Path, default=DEFAULT_JOB, help="the spark-submit entry point")
    parser.add_argument(
        "--action-on-failure",
        default="CONTINUE",
        choices=["CONTINUE", "CANCEL_AND_WAIT", "TERMINATE_CLUSTER"],
        help="EMR on EC2 step ActionOnFailure (default CONTINUE)",
    )
    parser.add_argument(
        "--conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark setting (repeatable; no secrets)"
    )
    parser.add_argument(
        "--secret-env",
        action="append",
        default=[],
        metavar="NAME=SECRET_ID",
        help="EMR Serverless: set driver environment variable NAME from this Secrets Manager secret (repeatable)",
    )
    return parser


def main(argv: Sequence[str] | None = None, client: ClientFactory | None = None) -> int:
    """Run the tool; `client` stands in for boto3's clients (tests)."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.serverless_application_id and not args.execution_role_arn:
        parser.error("--serverless-application-id needs --execution-role-arn")
    if args.cluster_id and (args.execution_role_arn or args.secret_env):
        parser.error(
            "--execution-role-arn and --secret-env are for EMR Serverless; on EMR on EC2 set the driver's "
            "environment in the cluster's configuration (infra/README.md, Secrets)"
        )
    if args.dry_run and not (args.release_label or args.spark_version):
        parser.error("--dry-run calls nothing, so it needs --release-label (or --spark-version) to choose the jars")
    try:
        pipeline = read_pipeline(args.config)
        art = plan_artifacts(args.s3_prefix, args.config, args.archive, args.job)
        conf = check_conf(args.conf)
        secret_env = parse_secret_env(args.secret_env)
    except ValueError as e:
        parser.error(str(e))

    for key in plaintext_passwords(pipeline):
        print(
            f"WARNING: {args.config}: `{key}` is a plain-text password; it would be uploaded to S3 as is, and the "
            "job refuses it. Use {env: NAME} or {file: PATH} (infra/README.md, Secrets).",
            file=sys.stderr,
        )
    needed = env_references(pipeline)
    if needed:
        missing = [n for n in needed if n not in secret_env]
        print(f"note: the driver needs these environment variables: {', '.join(needed)}", file=sys.stderr)
        if args.serverless_application_id and missing:
            print(f"note: no --secret-env for {', '.join(missing)}", file=sys.stderr)

    aws = client or aws_clients(args.region)
    name = args.name or f"ingest-{pipeline.get('name', 'pipeline')}"
    try:
        # The release decides the Spark, hence the jars; one the job cannot run stops here, before any upload.
        label = args.release_label
        if label is None and not args.spark_version:
            label = read_release_label(aws, args.cluster_id, args.serverless_application_id)
        spark = choose_spark(label, args.spark_version)
        source = "--spark-version" if args.spark_version else label
        print(f"note: Spark {spark} ({source}): the jars built for it", file=sys.stderr)
        service: Service
        if args.cluster_id:
            service, operation = "emr", "AddJobFlowSteps"
            request: dict[str, Any] = {
                "JobFlowId": args.cluster_id,
                "Steps": [build_emr_step(art, name, spark, args.action_on_failure, conf)],
            }
        else:
            service, operation = "emr-serverless", "StartJobRun"
            request = build_serverless_job_run(
                art, args.serverless_application_id, args.execution_role_arn, name, spark, secret_env, conf
            )
        check_request(service, operation, request)
    except (ConfigError, ValueError) as e:
        parser.error(str(e))

    if args.dry_run:
        for path, key in art.uploads:
            print(f"dry run: would upload {path} -> s3://{art.bucket}/{key}", file=sys.stderr)
        print(f"dry run: the {operation} request fits botocore's {service} model", file=sys.stderr)
        print(json.dumps(request, indent=2))
        return 0

    missing_files = [str(p) for p in (art.archive, art.job, art.config) if not p.is_file()]
    if missing_files:
        parser.error(f"missing: {', '.join(missing_files)} (build the archive with infra/package.sh)")
    upload(art, aws)
    response = call(aws(service), service, operation, request)
    if args.cluster_id:
        print(f"added step {response['StepIds'][0]} to {args.cluster_id}")
    else:
        print(f"started job run {response['jobRunId']} in application {response['applicationId']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
