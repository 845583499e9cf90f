"""JVM jars, pinned by version, fetched from Maven Central into a cache outside git.

The Iceberg Spark runtime is built for one Spark minor version and one Scala version, so it is chosen
from the Spark that runs the job: PySpark's version where the job launches its own JVM, the cluster's
Spark (from the platform's release label) in the submit tools. Spark 4.0 and 4.1 are supported; any
other Spark is refused before a JVM starts, with one line naming the versions that work.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ingest.errors import ConfigError, ServiceStartError
from ingest.runtime.cache import tools_dir

log = logging.getLogger(__name__)

SCALA_BINARY = "2.13"
ICEBERG_VERSION = "1.11.0"
# Spark minor versions the job runs on. Spark 3.5 lacks the Python data source API the snapshot and the
# job's streaming query are built on (pyspark.sql.datasource, Spark 4.0+); Iceberg 1.11 has no runtime for 4.2+.
SUPPORTED_SPARK = ("4.0", "4.1")


@dataclass(frozen=True)
class MavenJar:
    group: str
    artifact: str
    version: str

    @property
    def coordinate(self) -> str:
        return f"{self.group}:{self.artifact}:{self.version}"

    @property
    def file_name(self) -> str:
        return f"{self.artifact}-{self.version}.jar"


# S3FileIO with its AWS SDK, for MinIO, S3 on EMR, and any S3-compatible store.
ICEBERG_AWS_BUNDLE = MavenJar("org.apache.iceberg", "iceberg-aws-bundle", ICEBERG_VERSION)
# JDBC catalog drivers: SQLite for the embedded default, PostgreSQL for the networked profile.
SQLITE_JDBC = MavenJar("org.xerial", "sqlite-jdbc", "3.50.3.0")
POSTGRES_JDBC = MavenJar("org.postgresql", "postgresql", "42.7.8")


class UnsupportedSpark(ConfigError):
    """The Spark that would run the job is one the Iceberg runtime and the job do not support."""


def spark_minor(version: str) -> str:
    """`4.0` of `4.0.1`, `4.1.0-amzn-0`, `4.0`; a version that does not start with two numbers is refused."""
    found = re.match(r"(\d+)\.(\d+)(?:\D|$)", version.strip())
    if found is None:
        raise UnsupportedSpark(f"cannot read a Spark version from {version!r}")
    return f"{found.group(1)}.{found.group(2)}"


def check_spark(version: str) -> str:
    """The minor version of a supported Spark; any other is refused with one line naming those that work."""
    minor = spark_minor(version)
    if minor not in SUPPORTED_SPARK:
        raise UnsupportedSpark(
            f"Spark {version} is not supported: the job runs on Spark {' and '.join(SUPPORTED_SPARK)} "
            f"(Scala {SCALA_BINARY}, Iceberg {ICEBERG_VERSION})"
        )
    return minor


def iceberg_runtime(spark_version: str) -> MavenJar:
    """The Iceberg Spark runtime built for this Spark."""
    minor = check_spark(spark_version)
    return MavenJar("org.apache.iceberg", f"iceberg-spark-runtime-{minor}_{SCALA_BINARY}", ICEBERG_VERSION)


def required_jars(spark_version: str) -> tuple[MavenJar, ...]:
    """Every jar the job needs on the classpath of this Spark."""
    return (iceberg_runtime(spark_version), ICEBERG_AWS_BUNDLE, SQLITE_JDBC, POSTGRES_JDBC)


def maven_packages(spark_version: str) -> str:
    """The jars as `--packages` / `spark.jars.packages` wants them."""
    return ",".join(jar.coordinate for jar in required_jars(spark_version))


def installed_spark() -> str:
    """The version of the PySpark this interpreter imports (the Spark a local job launches)."""
    import pyspark

    return str(pyspark.__version__)


def jar_dir() -> Path:
    return tools_dir() / "jars"


def local_jars(spark_version: str) -> list[Path] | None:
    """All jars this Spark needs from the cache, or None when any is missing."""
    paths = [jar_dir() / jar.file_name for jar in required_jars(spark_version)]
    return paths if all(p.is_file() for p in paths) else None


def fetch_jars(spark_version: str) -> list[Path]:
    """Download missing jars with Maven (`dependency:copy`, no transitive jars: the runtimes are shaded). Maven's
    local repository is a throwaway one: the jars are kept once, here, not in ~/.m2 as well."""
    mvn = shutil.which("mvn")
    target = jar_dir()
    target.mkdir(parents=True, exist_ok=True)
    jars = required_jars(spark_version)
    missing = [jar for jar in jars if not (target / jar.file_name).is_file()]
    if missing and mvn is None:
        raise ServiceStartError("Maven (mvn) is needed to fetch the Iceberg jars; run `make setup`")
    with tempfile.TemporaryDirectory(prefix="ingest-m2-") as repository:
        for jar in missing:
            log.info("fetching %s", jar.coordinate)
            done = subprocess.run(
                [
                    str(mvn),
                    "-q",
                    "-B",
                    f"-Dmaven.repo.local={repository}",
                    "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy",
                    f"-Dartifact={jar.coordinate}",
                    f"-DoutputDirectory={target}",
                    "-Dmdep.overWriteIfNewer=false",
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0 or not (target / jar.file_name).is_file():
                raise ServiceStartError(
                    f"could not fetch {jar.coordinate}:\n{done.stdout[-1500:]}{done.stderr[-1500:]}"
                )
    return [target / jar.file_name for jar in jars]


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m ingest.runtime.jars", description="Fetch the jars the job needs into the cache, or name them."
    )
    parser.add_argument(
        "--spark", metavar="VERSION", help="the Spark that runs the job (default: the installed PySpark)"
    )
    parser.add_argument(
        "--packages", action="store_true", help="print the Maven coordinates for --packages; fetch nothing"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        version = args.spark or installed_spark()
        if args.packages:
            print(maven_packages(version))
            return 0
        for path in fetch_jars(version):
            print(path)
    except (ConfigError, ServiceStartError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
