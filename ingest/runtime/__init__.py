"""The JVM side: which jars Spark needs and how a Spark session with Iceberg is built."""
