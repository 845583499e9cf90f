"""The cluster submit tools build the command lines they should, with no secret in them, and call nothing
in dry-run mode: infra/emr/submit.py (EMR on EC2 and EMR Serverless) and infra/dataproc/submit.sh."""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from ingest.runtime.jars import REQUIRED_JARS

ROOT = Path(__file__).resolve().parents[2]
EMR_SUBMIT = ROOT / "infra" / "emr" / "submit.py"
DATAPROC_SUBMIT = ROOT / "infra" / "dataproc" / "submit.sh"
PACKAGES = ",".join(jar.coordinate for jar in REQUIRED_JARS)
FAKE_SECRET = "fake-secret-Zq81-do-not-leak"
FAKE_S3_SECRET = "fake-s3-secret-Yx42-do-not-leak"

PIPELINE = """\
name: orders
source:
  host: db.internal
  user: cdc
  password: {env: INGEST_TEST_FAKE_MYSQL_PASSWORD}
tables:
  include: ['shop\\..*']
sink:
  catalog:
    type: rest
    uri: https://catalog.internal
    s3.secret-access-key: {env: INGEST_TEST_FAKE_S3_SECRET}
"""


def load_submit() -> ModuleType:
    spec = importlib.util.spec_from_file_location("infra_emr_submit", EMR_SUBMIT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def submit() -> ModuleType:
    return load_submit()


@pytest.fixture
def pipeline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("INGEST_TEST_FAKE_MYSQL_PASSWORD", FAKE_SECRET)
    monkeypatch.setenv("INGEST_TEST_FAKE_S3_SECRET", FAKE_S3_SECRET)
    path = tmp_path / "pipeline.yaml"
    path.write_text(PIPELINE)
    return path


@pytest.fixture
def no_aws(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any boto3 session fails the test: dry runs must not reach AWS."""
    import boto3.session

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a dry run created a boto3 session")

    monkeypatch.setattr(boto3.session, "Session", refuse)


def value_after(args: list[str], flag: str) -> str:
    assert flag in args, f"{flag} missing from {args}"
    return args[args.index(flag) + 1]


def assert_no_secret(text: str) -> None:
    assert FAKE_SECRET not in text
    assert FAKE_S3_SECRET not in text


def test_emr_step_runs_the_packed_job_with_the_pinned_jars(submit: ModuleType, pipeline: Path) -> None:
    art = submit.plan_artifacts("s3://my-bucket/ingest/prod/", pipeline)
    step = submit.build_emr_step(art, "ingest-orders")

    assert step["HadoopJarStep"]["Jar"] == "command-runner.jar"
    args = step["HadoopJarStep"]["Args"]
    assert args[:3] == ["spark-submit", "--deploy-mode", "cluster"]
    assert value_after(args, "--archives") == "s3://my-bucket/ingest/prod/ingest-env.tar.gz#environment"
    assert value_after(args, "--packages") == PACKAGES
    assert value_after(args, "--files") == "s3://my-bucket/ingest/prod/pipeline.yaml"
    assert "spark.pyspark.python=./environment/bin/python" in args
    job = args.index("s3://my-bucket/ingest/prod/ingest_job.py")
    assert args[job + 1 :] == ["--config", "pipeline.yaml", "--until-caught-up"]
    assert_no_secret(json.dumps(step))


def test_emr_dry_run_prints_the_step_without_secrets_and_calls_nothing(
    submit: ModuleType, pipeline: Path, no_aws: None, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--config", str(pipeline), "--s3-prefix", "s3://my-bucket/ingest", "--cluster-id", "j-TEST123"]
    assert submit.main([*argv, "--dry-run"]) == 0
    out, err = capsys.readouterr()

    request = json.loads(out)
    assert request["JobFlowId"] == "j-TEST123"
    [step] = request["Steps"]
    assert step["Name"] == "ingest-orders"
    expected = submit.build_emr_step(submit.plan_artifacts("s3://my-bucket/ingest", pipeline), "ingest-orders")
    assert step == expected
    assert value_after(step["HadoopJarStep"]["Args"], "--packages") == PACKAGES
    assert_no_secret(out + err)
    # It names the variables the driver needs, not their values.
    assert "INGEST_TEST_FAKE_MYSQL_PASSWORD" in err


def test_emr_dry_run_as_a_script(pipeline: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(EMR_SUBMIT), "--config", str(pipeline), "--s3-prefix", "s3://my-bucket/x",
         "--cluster-id", "j-TEST123", "--dry-run"],
        capture_output=True, text=True, check=False, env=os.environ, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    args = json.loads(done.stdout)["Steps"][0]["HadoopJarStep"]["Args"]
    assert value_after(args, "--packages") == PACKAGES
    assert "s3://my-bucket/x/ingest_job.py" in args
    assert_no_secret(done.stdout + done.stderr)


def test_emr_serverless_job_run_is_equivalent_and_references_secrets_by_id(
    submit: ModuleType, pipeline: Path, no_aws: None, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "--config", str(pipeline), "--s3-prefix", "s3://my-bucket/ingest",
        "--serverless-application-id", "00abcdef", "--execution-role-arn", "arn:aws:iam::123456789012:role/job",
        "--secret-env", "INGEST_TEST_FAKE_MYSQL_PASSWORD=prod/ingest/mysql", "--dry-run",
    ]  # fmt: skip
    assert submit.main(argv) == 0
    out, err = capsys.readouterr()
    request = json.loads(out)

    assert request["applicationId"] == "00abcdef"
    assert request["executionRoleArn"] == "arn:aws:iam::123456789012:role/job"
    driver = request["jobDriver"]["sparkSubmit"]
    assert driver["entryPoint"] == "s3://my-bucket/ingest/ingest_job.py"
    assert driver["entryPointArguments"] == ["--config", "pipeline.yaml", "--until-caught-up"]
    params = shlex.split(driver["sparkSubmitParameters"])
    confs = dict(value.split("=", 1) for flag, value in zip(params[::2], params[1::2], strict=True) if flag == "--conf")
    assert confs["spark.jars.packages"] == PACKAGES
    assert confs["spark.archives"] == "s3://my-bucket/ingest/ingest-env.tar.gz#environment"
    assert confs["spark.files"] == "s3://my-bucket/ingest/pipeline.yaml"
    assert confs["spark.emr-serverless.driverEnv.PYSPARK_PYTHON"] == "./environment/bin/python"
    [defaults] = request["configurationOverrides"]["applicationConfiguration"]
    assert defaults["properties"] == {
        "spark.emr-serverless.driverEnv.INGEST_TEST_FAKE_MYSQL_PASSWORD": "EMR.secret@prod/ingest/mysql"
    }
    assert_no_secret(out + err)
    assert "no --secret-env for INGEST_TEST_FAKE_S3_SECRET" in err


def test_plain_text_password_in_the_pipeline_file_is_warned_about(
    submit: ModuleType, tmp_path: Path, no_aws: None, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "plain.yaml"
    path.write_text("name: p\nsource: {host: h, user: u, password: hunter2}\n")
    assert submit.main(["--config", str(path), "--s3-prefix", "s3://bkt/p", "--cluster-id", "j-1", "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert "WARNING" in err and "`source.password`" in err


def test_reference_passwords_are_not_warned_about(
    submit: ModuleType, pipeline: Path, no_aws: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        submit.main(["--config", str(pipeline), "--s3-prefix", "s3://bkt/p", "--cluster-id", "j-1", "--dry-run"]) == 0
    )
    assert "WARNING" not in capsys.readouterr().err


def test_a_secret_setting_cannot_be_put_into_the_step(submit: ModuleType, pipeline: Path, no_aws: None) -> None:
    argv = ["--config", str(pipeline), "--s3-prefix", "s3://bkt/p", "--cluster-id", "j-1", "--dry-run"]
    with pytest.raises(SystemExit) as exit_info:
        submit.main([*argv, "--conf", f"spark.yarn.appMasterEnv.MYSQL_PASSWORD={FAKE_SECRET}"])
    assert exit_info.value.code == 2


def dataproc_dry_run(pipeline: Path, tmp_path: Path, *target: str) -> tuple[list[str], str]:
    """Run submit.sh --dry-run with a stand-in gcloud that records any call; (submit command, all output)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    called = tmp_path / "gcloud-called"
    fake = bin_dir / "gcloud"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {shlex.quote(str(called))}\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", str(DATAPROC_SUBMIT), "--config", str(pipeline), "--gcs-prefix", "gs://my-bucket/ingest/",
         "--region", "europe-west1", *target, "--dry-run"],
        capture_output=True, text=True, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert not called.exists(), "a dry run called gcloud"
    lines = [shlex.split(line) for line in done.stdout.splitlines() if line.strip()]
    kind = "batches" if "--serverless" in target else "jobs"
    submits = [words for words in lines if words[:3] == ["gcloud", "dataproc", kind]]
    assert len(submits) == 1, done.stdout
    return submits[0], done.stdout + done.stderr


def properties_of(command: list[str]) -> dict[str, str]:
    [arg] = [a for a in command if a.startswith("--properties=")]
    value = arg.removeprefix("--properties=")
    assert value.startswith("^#^"), "spark.jars.packages has commas: the list needs another delimiter"
    return dict(item.split("=", 1) for item in value.removeprefix("^#^").split("#"))


@pytest.mark.parametrize("target", [("--cluster", "etl-cluster"), ("--serverless",)])
def test_dataproc_dry_run_prints_the_same_packages(pipeline: Path, tmp_path: Path, target: tuple[str, ...]) -> None:
    command, output = dataproc_dry_run(pipeline, tmp_path, *target)

    assert command[3:6] == ["submit", "pyspark", "gs://my-bucket/ingest/ingest_job.py"]
    props = properties_of(command)
    assert props["spark.jars.packages"] == PACKAGES
    assert props["spark.pyspark.python"] == "./environment/bin/python"
    assert "--archives=gs://my-bucket/ingest/ingest-env.tar.gz#environment" in command
    assert "--files=gs://my-bucket/ingest/pipeline.yaml" in command
    assert "--region=europe-west1" in command
    assert command[command.index("--") + 1 :] == ["--config", "pipeline.yaml", "--until-caught-up"]
    if target[0] == "--cluster":
        assert command[2] == "jobs" and "--cluster=etl-cluster" in command
        assert props["spark.submit.deployMode"] == "cluster"
    else:
        assert command[2] == "batches"
    assert_no_secret(output)
