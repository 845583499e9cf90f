"""The Structured Streaming query that ties the stages: the job (`pipeline`), its query (`structured`), the binlog
and chunk batches as its source (`binlog_source`), a binlog batch made ready to commit (`batch`), the binlog
phase's commits (`streaming`), the snapshot's chunks (`snapshot`), and requests taken while it runs (`adhoc`)."""
