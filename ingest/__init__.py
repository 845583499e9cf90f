"""Lock-free, exactly-once MySQL/MariaDB to Apache Iceberg ingestion on Apache Spark."""

__version__ = "0.1.0"
