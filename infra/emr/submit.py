#!/usr/bin/env python3
"""Submit the ingestion job to Amazon EMR on EC2 (a cluster step) or EMR Serverless (a job run).

Build the packed environment first (`infra/package.sh`), then, from the repository root:

    # EMR on EC2: upload, then add a step to a running cluster
    python infra/emr/submit.py --config pipeline.yaml --s3-prefix s3://my-bucket/ingest/prod \\
        --cluster-id j-ABCDEFGHIJKL --region eu-west-1

    # EMR Serverless: upload, then start a job run
    python infra/emr/submit.py --config pipeline.yaml --s3-prefix s3://my-bucket/ingest/prod \\
        --serverless-application-id 00abcdefghijklmn \\
        --execution-role-arn arn:aws:iam::123456789012:role/ingest-job \\
        --secret-env MYSQL_PASSWORD=prod/ingest/mysql-password --region eu-west-1

    # Either, with --dry-run: print the step (or job run) JSON and the uploads; no AWS call at all.

It uploads `dist/ingest-env.tar.gz`, `jobs/ingest_job.py` and the pipeline file under the S3 prefix and runs
`spark-submit --deploy-mode cluster --archives <env>#environment --packages <jars of ingest.runtime.jars>
<prefix>/ingest_job.py --config <pipeline file name> --until-caught-up`.

Secrets never go into the step: the pipeline file holds only `{env: NAME}` / `{file: PATH}` references and
the values reach the driver from AWS Secrets Manager (infra/README.md, "Secrets"). `--secret-env NAME=ID`
(EMR Serverless) adds `spark.emr-serverless.driverEnv.NAME=EMR.secret@ID`: a reference that EMR Serverless
resolves when the job starts, not the value.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, cast

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
if importlib.util.find_spec("ingest") is None:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(REPO_ROOT))

from ingest.runtime.jars import REQUIRED_JARS  # noqa: E402

DEFAULT_ARCHIVE = REPO_ROOT / "dist" / "ingest-env.tar.gz"
DEFAULT_JOB = REPO_ROOT / "jobs" / "ingest_job.py"
ARCHIVE_ALIAS = "environment"
ARCHIVE_PYTHON = f"./{ARCHIVE_ALIAS}/bin/python"
# Spark conf keys that would carry a secret value into the step, which anyone with
# elasticmapreduce:DescribeStep (or emr-serverless:GetJobRun) can read.
SECRET_KEY = re.compile(r"(?i)(password|secret|token|credential)")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def packages() -> str:
    """The `--packages` value: every jar the job needs, as pinned in ingest.runtime.jars."""
    return ",".join(jar.coordinate for jar in REQUIRED_JARS)


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
    names = [archive.name, job.name, config.name]
    if len(set(names)) != len(names):
        raise ValueError(f"the archive, the job and the pipeline file need distinct file names, got {names}")
    return Artifacts(archive=archive, job=job, config=config, bucket=bucket, key_prefix=key_prefix)


def job_arguments(config: Path) -> list[str]:
    """The job's own arguments: the pipeline file is shipped into the driver's working directory."""
    return ["--config", config.name, "--until-caught-up"]


def check_conf(conf: Sequence[str]) -> list[tuple[str, str]]:
    """Extra `KEY=VALUE` Spark settings; refuses keys that would put a secret into the step."""
    pairs = []
    for item in conf:
        key, sep, value = item.partition("=")
        if not sep or not key or any(c.isspace() for c in item):
            raise ValueError(f"--conf takes KEY=VALUE without spaces, got {item!r}")
        if SECRET_KEY.search(key) and not key.endswith("provider"):
            raise ValueError(
                f"--conf {key}=... would put a secret into the step, readable by anyone who can describe it; "
                "supply secrets from AWS Secrets Manager (infra/README.md, Secrets)"
            )
        pairs.append((key, value))
    return pairs


def spark_submit_args(art: Artifacts, conf: Sequence[tuple[str, str]] = ()) -> list[str]:
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
        packages(),
    ]
    for key, value in conf:
        args += ["--conf", f"{key}={value}"]
    return [*args, art.uri(art.job), *job_arguments(art.config)]


def build_emr_step(
    art: Artifacts, name: str, action_on_failure: str = "CONTINUE", conf: Sequence[tuple[str, str]] = ()
) -> dict[str, Any]:
    """One element of `Steps` for `emr.add_job_flow_steps`."""
    return {
        "Name": name,
        "ActionOnFailure": action_on_failure,
        "HadoopJarStep": {"Jar": "command-runner.jar", "Args": spark_submit_args(art, conf)},
    }


def build_serverless_job_run(
    art: Artifacts,
    application_id: str,
    execution_role_arn: str,
    name: str,
    secret_env: Mapping[str, str] | None = None,
    conf: Sequence[tuple[str, str]] = (),
) -> dict[str, Any]:
    """The keyword arguments of `emr-serverless.start_job_run`, equivalent to the EMR on EC2 step."""
    settings = [
        ("spark.archives", f"{art.uri(art.archive)}#{ARCHIVE_ALIAS}"),
        ("spark.files", art.uri(art.config)),
        ("spark.jars.packages", packages()),
        ("spark.emr-serverless.driverEnv.PYSPARK_DRIVER_PYTHON", ARCHIVE_PYTHON),
        ("spark.emr-serverless.driverEnv.PYSPARK_PYTHON", ARCHIVE_PYTHON),
        ("spark.executorEnv.PYSPARK_PYTHON", ARCHIVE_PYTHON),
        *conf,
    ]
    request: dict[str, Any] = {
        "applicationId": application_id,
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


def plaintext_passwords(data: Any, path: str = "") -> list[str]:
    """Key paths of the pipeline file whose key names a password and whose value is a plain string."""
    found: list[str] = []
    if isinstance(data, Mapping):
        for key, value in data.items():
            where = f"{path}.{key}" if path else str(key)
            if "password" in str(key).lower() and isinstance(value, str):
                found.append(where)
            else:
                found += plaintext_passwords(value, where)
    elif isinstance(data, list):
        for i, value in enumerate(data):
            found += plaintext_passwords(value, f"{path}[{i}]")
    return found


def env_references(data: Any) -> list[str]:
    """Names of the environment variables the pipeline file's `{env: NAME}` secrets read."""
    if isinstance(data, Mapping):
        if len(data) == 1 and "env" in data and isinstance(data["env"], str):
            return [data["env"]]
        return sorted({name for value in data.values() for name in env_references(value)})
    if isinstance(data, list):
        return sorted({name for value in data for name in env_references(value)})
    return []


def read_pipeline(config: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(config.read_text())
    except OSError as e:
        raise ValueError(f"cannot read pipeline file {config}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ValueError(f"pipeline file {config} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"pipeline file {config} must be a YAML mapping")
    return data


def parse_secret_env(items: Sequence[str]) -> dict[str, str]:
    result = {}
    for item in items:
        name, sep, ref = item.partition("=")
        if not sep or not ENV_NAME.fullmatch(name) or not ref or any(c.isspace() for c in ref):
            raise ValueError(f"--secret-env takes NAME=SECRET_ID (a Secrets Manager name or ARN), got {item!r}")
        result[name] = ref
    return result


# --------------------------------------------------------------------------------------------------
# AWS calls (never made with --dry-run). Typed by the few methods used, so no service stubs are needed.


class S3Client(Protocol):
    def upload_file(self, Filename: str, Bucket: str, Key: str) -> None: ...


class EmrClient(Protocol):
    def add_job_flow_steps(self, *, JobFlowId: str, Steps: list[dict[str, Any]]) -> Mapping[str, Any]: ...


class EmrServerlessClient(Protocol):
    def start_job_run(self, **kwargs: Any) -> Mapping[str, Any]: ...


def _client(service: Literal["s3", "emr", "emr-serverless"], region: str | None) -> Any:
    import boto3

    return boto3.session.Session(region_name=region).client(service)


def upload(art: Artifacts, region: str | None) -> None:
    s3 = cast(S3Client, _client("s3", region))
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.serverless_application_id and not args.execution_role_arn:
        parser.error("--serverless-application-id needs --execution-role-arn")
    if args.cluster_id and (args.execution_role_arn or args.secret_env):
        parser.error(
            "--execution-role-arn and --secret-env are for EMR Serverless; on EMR on EC2 set the driver's "
            "environment in the cluster's configuration (infra/README.md, Secrets)"
        )
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

    name = args.name or f"ingest-{pipeline.get('name', 'pipeline')}"
    if args.cluster_id:
        request: dict[str, Any] = {
            "JobFlowId": args.cluster_id,
            "Steps": [build_emr_step(art, name, args.action_on_failure, conf)],
        }
    else:
        request = build_serverless_job_run(
            art, args.serverless_application_id, args.execution_role_arn, name, secret_env, conf
        )

    if args.dry_run:
        for path, key in art.uploads:
            print(f"dry run: would upload {path} -> s3://{art.bucket}/{key}", file=sys.stderr)
        print(json.dumps(request, indent=2))
        return 0

    missing_files = [str(p) for p in (art.archive, art.job, art.config) if not p.is_file()]
    if missing_files:
        parser.error(f"missing: {', '.join(missing_files)} (build the archive with infra/package.sh)")
    upload(art, args.region)
    if args.cluster_id:
        emr = cast(EmrClient, _client("emr", args.region))
        step_ids = emr.add_job_flow_steps(**request)["StepIds"]
        print(f"added step {step_ids[0]} to {args.cluster_id}")
    else:
        serverless = cast(EmrServerlessClient, _client("emr-serverless", args.region))
        run = serverless.start_job_run(**request)
        print(f"started job run {run['jobRunId']} in application {run['applicationId']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
