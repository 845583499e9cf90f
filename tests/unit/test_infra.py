"""infra/emr/submit.py builds the EMR on EC2 step and the EMR Serverless job run it should: requests that fit
botocore's model of each service, the jars for the Spark of the release label, no secret in them; a release
whose Spark the job cannot run is refused before anything is uploaded, and a dry run calls nothing.
(infra/dataproc/submit.py: test_infra_dataproc.py.)"""

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

import botocore.session
import pytest
from botocore.validate import ParamValidator

from ingest.runtime.jars import SUPPORTED_SPARK, maven_packages

ROOT = Path(__file__).resolve().parents[2]
EMR_SUBMIT = ROOT / "infra" / "emr" / "submit.py"
FAKE_SECRET = "fake-secret-Zq81-do-not-leak"
FAKE_S3_SECRET = "fake-s3-secret-Yx42-do-not-leak"
SPARK_40_RUNTIME = "org.apache.iceberg:iceberg-spark-runtime-4.0_2.13:"
SPARK_41_RUNTIME = "org.apache.iceberg:iceberg-spark-runtime-4.1_2.13:"
ROLE = "arn:aws:iam::123456789012:role/job"

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


def load_tool(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def write_pipeline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A pipeline file whose secrets are `{env: ...}` references to fake values set in the environment."""
    monkeypatch.setenv("INGEST_TEST_FAKE_MYSQL_PASSWORD", FAKE_SECRET)
    monkeypatch.setenv("INGEST_TEST_FAKE_S3_SECRET", FAKE_S3_SECRET)
    path = tmp_path / "pipeline.yaml"
    path.write_text(PIPELINE)
    return path


def shipped_files(tmp_path: Path) -> list[str]:
    """Stand-ins for the packed environment and the entry point, so a run that is not dry gets to its calls."""
    archive, job = tmp_path / "ingest-env.tar.gz", tmp_path / "ingest_job.py"
    archive.write_bytes(b"not really a tarball")
    job.write_text("print('job')\n")
    return ["--archive", str(archive), "--job", str(job)]


def assert_no_secret(text: str) -> None:
    assert FAKE_SECRET not in text
    assert FAKE_S3_SECRET not in text


def value_after(args: list[str], flag: str) -> str:
    assert flag in args, f"{flag} missing from {args}"
    return args[args.index(flag) + 1]


@pytest.fixture
def submit() -> ModuleType:
    return load_tool(EMR_SUBMIT, "infra_emr_submit")


@pytest.fixture
def pipeline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return write_pipeline(tmp_path, monkeypatch)


@pytest.fixture
def no_aws(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any boto3 session fails the test: dry runs must not reach AWS."""
    import boto3.session

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a dry run created a boto3 session")

    monkeypatch.setattr(boto3.session, "Session", refuse)


class RecordingAws:
    """Stands in for boto3's clients: records every call, answers the few the tool reads."""

    def __init__(self, release_label: str = "emr-spark-8.0.0") -> None:
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        self.answers: dict[str, Any] = {
            "describe_cluster": {"Cluster": {"Id": "j-TEST123", "ReleaseLabel": release_label}},
            "get_application": {"application": {"applicationId": "00abcdef", "releaseLabel": release_label}},
            "add_job_flow_steps": {"StepIds": ["s-1"]},
            "start_job_run": {"applicationId": "00abcdef", "jobRunId": "00run"},
            "upload_file": None,
        }

    def __call__(self, service: str) -> Any:
        recorder = self

        class Client:
            def __getattr__(self, method: str) -> Any:
                def record(**params: Any) -> Any:
                    recorder.calls.append((service, method, params))
                    return recorder.answers[method]

                return record

        return Client()

    @property
    def methods(self) -> list[str]:
        return [method for _, method, _ in self.calls]


def model_errors(service: str, operation: str, params: dict[str, Any]) -> str:
    """What botocore's own parameter validation reports for this request ('' when it fits the model)."""
    shape = botocore.session.get_session().get_service_model(service).operation_model(operation).input_shape
    report = ParamValidator().validate(params, shape)
    return str(report.generate_report()) if report.has_errors() else ""


def confs_of(job_run: dict[str, Any]) -> dict[str, str]:
    params = shlex.split(job_run["jobDriver"]["sparkSubmit"]["sparkSubmitParameters"])
    return dict(value.split("=", 1) for flag, value in zip(params[::2], params[1::2], strict=True) if flag == "--conf")


CLUSTER = ["--cluster-id", "j-TEST123"]
SERVERLESS = ["--serverless-application-id", "00abcdef", "--execution-role-arn", ROLE]


def test_emr_step_runs_the_packed_job_with_the_jars_for_its_spark(submit: ModuleType, pipeline: Path) -> None:
    art = submit.plan_artifacts("s3://my-bucket/ingest/prod/", pipeline)
    step = submit.build_emr_step(art, "ingest-orders", "4.0.2")

    assert step["HadoopJarStep"]["Jar"] == "command-runner.jar"
    args = step["HadoopJarStep"]["Args"]
    assert args[:3] == ["spark-submit", "--deploy-mode", "cluster"]
    assert value_after(args, "--archives") == "s3://my-bucket/ingest/prod/ingest-env.tar.gz#environment"
    assert value_after(args, "--packages") == maven_packages("4.0.2")
    assert value_after(args, "--packages").startswith(SPARK_40_RUNTIME)
    assert value_after(args, "--files") == "s3://my-bucket/ingest/prod/pipeline.yaml"
    assert "spark.pyspark.python=./environment/bin/python" in args
    job = args.index("s3://my-bucket/ingest/prod/ingest_job.py")
    assert args[job + 1 :] == ["--config", "pipeline.yaml", "--until-caught-up"]
    assert model_errors("emr", "AddJobFlowSteps", {"JobFlowId": "j-TEST123", "Steps": [step]}) == ""
    assert_no_secret(json.dumps(step))


def test_emr_dry_run_prints_the_step_without_secrets_and_calls_nothing(
    submit: ModuleType, pipeline: Path, no_aws: None, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--config", str(pipeline), "--s3-prefix", "s3://my-bucket/ingest", *CLUSTER]
    assert submit.main([*argv, "--release-label", "emr-spark-8.0.0", "--dry-run"]) == 0
    out, err = capsys.readouterr()

    request = json.loads(out)
    assert model_errors("emr", "AddJobFlowSteps", request) == ""
    assert request["JobFlowId"] == "j-TEST123"
    [step] = request["Steps"]
    assert step["Name"] == "ingest-orders"
    expected = submit.build_emr_step(submit.plan_artifacts("s3://my-bucket/ingest", pipeline), "ingest-orders", "4.0")
    assert step == expected
    assert value_after(step["HadoopJarStep"]["Args"], "--packages").startswith(SPARK_40_RUNTIME)
    assert "fits botocore's emr model" in err
    assert_no_secret(out + err)
    # It names the variables the driver needs, not their values.
    assert "INGEST_TEST_FAKE_MYSQL_PASSWORD" in err


def test_emr_dry_run_as_a_script(pipeline: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(EMR_SUBMIT), "--config", str(pipeline), "--s3-prefix", "s3://my-bucket/x",
         *CLUSTER, "--release-label", "emr-spark-8.0.0-latest", "--dry-run"],
        capture_output=True, text=True, check=False, env=os.environ, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    request = json.loads(done.stdout)
    assert model_errors("emr", "AddJobFlowSteps", request) == ""
    args = request["Steps"][0]["HadoopJarStep"]["Args"]
    assert value_after(args, "--packages") == maven_packages("4.0.2")
    assert "s3://my-bucket/x/ingest_job.py" in args
    assert_no_secret(done.stdout + done.stderr)


def test_emr_serverless_job_run_is_equivalent_and_references_secrets_by_id(
    submit: ModuleType, pipeline: Path, no_aws: None, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "--config", str(pipeline), "--s3-prefix", "s3://my-bucket/ingest", *SERVERLESS,
        "--secret-env", "INGEST_TEST_FAKE_MYSQL_PASSWORD=prod/ingest/mysql",
        "--release-label", "emr-spark-8.0.0", "--dry-run",
    ]  # fmt: skip
    assert submit.main(argv) == 0
    out, err = capsys.readouterr()
    request = json.loads(out)

    assert model_errors("emr-serverless", "StartJobRun", request) == ""
    assert request["applicationId"] == "00abcdef"
    assert request["executionRoleArn"] == ROLE
    driver = request["jobDriver"]["sparkSubmit"]
    assert driver["entryPoint"] == "s3://my-bucket/ingest/ingest_job.py"
    assert driver["entryPointArguments"] == ["--config", "pipeline.yaml", "--until-caught-up"]
    confs = confs_of(request)
    assert confs["spark.jars.packages"] == maven_packages("4.0.2")
    assert confs["spark.archives"] == "s3://my-bucket/ingest/ingest-env.tar.gz#environment"
    assert confs["spark.files"] == "s3://my-bucket/ingest/pipeline.yaml"
    assert confs["spark.emr-serverless.driverEnv.PYSPARK_PYTHON"] == "./environment/bin/python"
    [defaults] = request["configurationOverrides"]["applicationConfiguration"]
    assert defaults["properties"] == {
        "spark.emr-serverless.driverEnv.INGEST_TEST_FAKE_MYSQL_PASSWORD": "EMR.secret@prod/ingest/mysql"
    }
    assert_no_secret(out + err)
    assert "no --secret-env for INGEST_TEST_FAKE_S3_SECRET" in err


@pytest.mark.parametrize("target", [CLUSTER, SERVERLESS], ids=["step", "job-run"])
def test_a_spark_version_overrides_the_label_and_picks_its_runtime(
    submit: ModuleType, pipeline: Path, no_aws: None, capsys: pytest.CaptureFixture[str], target: list[str]
) -> None:
    argv = ["--config", str(pipeline), "--s3-prefix", "s3://bkt/p", *target, "--spark-version", "4.1.0", "--dry-run"]
    assert submit.main(argv) == 0
    request = json.loads(capsys.readouterr().out)
    if target is CLUSTER:
        assert model_errors("emr", "AddJobFlowSteps", request) == ""
        packages = value_after(request["Steps"][0]["HadoopJarStep"]["Args"], "--packages")
    else:
        assert model_errors("emr-serverless", "StartJobRun", request) == ""
        packages = confs_of(request)["spark.jars.packages"]
    assert packages == maven_packages("4.1.0")
    assert packages.startswith(SPARK_41_RUNTIME)


@pytest.mark.parametrize("target", [CLUSTER, SERVERLESS], ids=["step", "job-run"])
@pytest.mark.parametrize("label", ["emr-7.12.0", "emr-7.0.0"])
def test_a_spark_35_release_is_refused_before_anything_is_uploaded(
    submit: ModuleType,
    pipeline: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    target: list[str],
    label: str,
) -> None:
    aws = RecordingAws()
    argv = ["--config", str(pipeline), "--s3-prefix", "s3://bkt/p", *target, *shipped_files(tmp_path)]
    with pytest.raises(SystemExit) as exit_info:
        submit.main([*argv, "--release-label", label], client=aws)
    assert exit_info.value.code == 2
    assert aws.calls == []
    err = capsys.readouterr().err
    assert f"EMR release {label}: Spark 3.5.x is not supported" in err
    assert f"Spark {' and '.join(SUPPORTED_SPARK)}" in err


@pytest.mark.parametrize(
    ("target", "lookup"), [(CLUSTER, "describe_cluster"), (SERVERLESS, "get_application")], ids=["step", "job-run"]
)
def test_the_label_read_from_the_service_is_refused_before_the_upload(
    submit: ModuleType, pipeline: Path, tmp_path: Path, target: list[str], lookup: str
) -> None:
    aws = RecordingAws(release_label="emr-7.12.0")
    argv = ["--config", str(pipeline), "--s3-prefix", "s3://bkt/p", *target, *shipped_files(tmp_path)]
    with pytest.raises(SystemExit) as exit_info:
        submit.main(argv, client=aws)
    assert exit_info.value.code == 2
    assert aws.methods == [lookup]


@pytest.mark.parametrize(
    ("target", "calls"),
    [
        (CLUSTER, [("emr", "describe_cluster"), *[("s3", "upload_file")] * 3, ("emr", "add_job_flow_steps")]),
        (SERVERLESS, [("emr-serverless", "get_application"), *[("s3", "upload_file")] * 3,
                      ("emr-serverless", "start_job_run")]),
    ],
    ids=["step", "job-run"],
)  # fmt: skip
def test_a_submission_reads_the_label_uploads_then_sends_a_request_that_fits_the_model(
    submit: ModuleType,
    pipeline: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    target: list[str],
    calls: list[tuple[str, str]],
) -> None:
    aws = RecordingAws(release_label="emr-spark-8.0.0")
    argv = ["--config", str(pipeline), "--s3-prefix", "s3://bkt/p", *target, *shipped_files(tmp_path)]
    assert submit.main(argv, client=aws) == 0

    assert [(service, method) for service, method, _ in aws.calls] == calls
    service, method, request = aws.calls[-1]
    operation = {"add_job_flow_steps": "AddJobFlowSteps", "start_job_run": "StartJobRun"}[method]
    assert model_errors(service, operation, request) == ""
    sent = json.dumps(request)
    assert SPARK_40_RUNTIME in sent and SPARK_41_RUNTIME not in sent
    assert_no_secret(sent + json.dumps([params for _, _, params in aws.calls], default=str) + capsys.readouterr().out)


def test_a_label_the_tool_does_not_know_needs_a_spark_version(
    submit: ModuleType, pipeline: Path, no_aws: None, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--config", str(pipeline), "--s3-prefix", "s3://bkt/p", *CLUSTER, "--release-label", "emr-9.1.0"]
    with pytest.raises(SystemExit) as exit_info:
        submit.main([*argv, "--dry-run"])
    assert exit_info.value.code == 2
    assert "give --spark-version" in capsys.readouterr().err

    assert submit.main([*argv, "--spark-version", "4.1.2", "--dry-run"]) == 0
    assert SPARK_41_RUNTIME in capsys.readouterr().out


def test_a_dry_run_needs_the_label_or_the_spark_version(
    submit: ModuleType, pipeline: Path, no_aws: None, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        submit.main(["--config", str(pipeline), "--s3-prefix", "s3://bkt/p", *CLUSTER, "--dry-run"])
    assert exit_info.value.code == 2
    assert "--release-label" in capsys.readouterr().err


def test_the_model_check_reports_a_malformed_request(submit: ModuleType, pipeline: Path) -> None:
    """The check is not vacuous: botocore's validation and the model's own limits reject broken requests."""

    def rejected(service: str, operation: str, request: dict[str, Any]) -> str:
        with pytest.raises(submit.RequestRejected) as error:
            submit.check_request(service, operation, request)
        return str(error.value)

    art = submit.plan_artifacts("s3://bkt/p", pipeline)
    step = submit.build_emr_step(art, "ingest-orders", "4.0.2")

    def steps(**change: Any) -> dict[str, Any]:
        return {"JobFlowId": "j-1", "Steps": [{**step, **change}]}

    no_jar = steps(HadoopJarStep={"Args": step["HadoopJarStep"]["Args"]})
    assert "Missing required parameter" in model_errors("emr", "AddJobFlowSteps", no_jar)
    assert "Missing required parameter in Steps[0].HadoopJarStep" in rejected("emr", "AddJobFlowSteps", no_jar)
    assert 'Unknown parameter in Steps[0]: "Jar"' in rejected("emr", "AddJobFlowSteps", steps(Jar="x.jar"))
    assert "'RETRY' is not one of" in rejected("emr", "AddJobFlowSteps", steps(ActionOnFailure="RETRY"))
    assert "257 characters, at most 256" in rejected("emr", "AddJobFlowSteps", steps(Name="x" * 257))

    job_run = submit.build_serverless_job_run(art, "00abcdef", ROLE, "ingest-orders", "4.0.2")
    assert submit.check_request("emr-serverless", "StartJobRun", job_run) is None
    without_role = {k: v for k, v in job_run.items() if k != "executionRoleArn"}
    assert "executionRoleArn" in model_errors("emr-serverless", "StartJobRun", without_role)
    assert "executionRoleArn" in rejected("emr-serverless", "StartJobRun", without_role)
    assert "does not match [0-9a-z]+" in rejected("emr-serverless", "StartJobRun", {**job_run, "applicationId": "0A"})
    assert "Invalid type for parameter name" in rejected("emr-serverless", "StartJobRun", {**job_run, "name": 42})


def test_the_tool_refuses_a_request_the_model_rejects_before_calling(
    submit: ModuleType, pipeline: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    aws = RecordingAws()
    argv = [
        "--config", str(pipeline), "--s3-prefix", "s3://bkt/p", *shipped_files(tmp_path), "--spark-version", "4.0.2",
        "--serverless-application-id", "Not-An-Id", "--execution-role-arn", ROLE,
    ]  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:
        submit.main(argv, client=aws)
    assert exit_info.value.code == 2
    assert aws.calls == []
    assert "StartJobRun request does not fit the API model" in capsys.readouterr().err


def test_plain_text_password_in_the_pipeline_file_is_warned_about(
    submit: ModuleType, tmp_path: Path, no_aws: None, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "plain.yaml"
    path.write_text("name: p\nsource: {host: h, user: u, password: hunter2}\n")
    argv = ["--config", str(path), "--s3-prefix", "s3://bkt/p", "--cluster-id", "j-1", "--spark-version", "4.1.0"]
    assert submit.main([*argv, "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert "WARNING" in err and "`source.password`" in err


def test_reference_passwords_are_not_warned_about(
    submit: ModuleType, pipeline: Path, no_aws: None, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--config", str(pipeline), "--s3-prefix", "s3://bkt/p", "--cluster-id", "j-1", "--spark-version", "4.1.0"]
    assert submit.main([*argv, "--dry-run"]) == 0
    assert "WARNING" not in capsys.readouterr().err


def test_a_secret_setting_cannot_be_put_into_the_step(submit: ModuleType, pipeline: Path, no_aws: None) -> None:
    argv = ["--config", str(pipeline), "--s3-prefix", "s3://bkt/p", "--cluster-id", "j-1", "--dry-run"]
    with pytest.raises(SystemExit) as exit_info:
        submit.main([*argv, "--release-label", "emr-spark-8.0.0", "--conf", f"spark.x.MYSQL_PASSWORD={FAKE_SECRET}"])
    assert exit_info.value.code == 2
