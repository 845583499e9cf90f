"""JVM jars, pinned by version, fetched from Maven Central into a cache outside git.

The Iceberg Spark runtime must match PySpark's minor version and Scala version; bump them together
with `pyspark` in pyproject.toml.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ingest.devservers.process import tools_dir
from ingest.errors import ServiceStartError

log = logging.getLogger(__name__)

SPARK_MINOR = "4.1"
SCALA_BINARY = "2.13"
ICEBERG_VERSION = "1.11.0"


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


ICEBERG_SPARK_RUNTIME = MavenJar(
    "org.apache.iceberg", f"iceberg-spark-runtime-{SPARK_MINOR}_{SCALA_BINARY}", ICEBERG_VERSION
)
# S3FileIO with its AWS SDK, for MinIO, S3 on EMR, and any S3-compatible store.
ICEBERG_AWS_BUNDLE = MavenJar("org.apache.iceberg", "iceberg-aws-bundle", ICEBERG_VERSION)
# JDBC catalog drivers: SQLite for the embedded default, PostgreSQL for the networked profile.
SQLITE_JDBC = MavenJar("org.xerial", "sqlite-jdbc", "3.50.3.0")
POSTGRES_JDBC = MavenJar("org.postgresql", "postgresql", "42.7.8")

REQUIRED_JARS: tuple[MavenJar, ...] = (ICEBERG_SPARK_RUNTIME, ICEBERG_AWS_BUNDLE, SQLITE_JDBC, POSTGRES_JDBC)


def jar_dir() -> Path:
    return tools_dir() / "jars"


def local_jars() -> list[Path] | None:
    """All required jars from the cache, or None when any is missing."""
    paths = [jar_dir() / jar.file_name for jar in REQUIRED_JARS]
    return paths if all(p.is_file() for p in paths) else None


def fetch_jars() -> list[Path]:
    """Download missing jars with Maven (`dependency:copy`, no transitive jars: the runtimes are shaded)."""
    mvn = shutil.which("mvn")
    target = jar_dir()
    target.mkdir(parents=True, exist_ok=True)
    for jar in REQUIRED_JARS:
        if (target / jar.file_name).is_file():
            continue
        if mvn is None:
            raise ServiceStartError("Maven (mvn) is needed to fetch the Iceberg jars; run `make setup`")
        log.info("fetching %s", jar.coordinate)
        done = subprocess.run(
            [
                mvn,
                "-q",
                "-B",
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
            raise ServiceStartError(f"could not fetch {jar.coordinate}:\n{done.stdout[-1500:]}{done.stderr[-1500:]}")
    return [target / jar.file_name for jar in REQUIRED_JARS]


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for path in fetch_jars():
        print(path)
    sys.exit(0)
