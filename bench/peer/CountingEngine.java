/*
 * Debezium's MariaDB connector in an embedded engine whose consumer counts every change record and drops it:
 * the peer that bench/peer.py measures the job against.
 *
 *     java -cp <jars>:<classes> CountingEngine engine.properties
 *
 * The properties file holds the connector's settings plus the bench's own keys (removed before the engine
 * sees them):
 *   bench.count         "snapshot" or "streaming": which records the target counts
 *   bench.target        stop once this many of them were counted
 *   bench.password.env  the environment variable that holds database.password
 *   bench.offset.file, bench.offset.pos, bench.offset.gtids
 *                       optional: the binlog position the connector resumes from, as if an earlier run of the
 *                       same engine had stopped there (see SeededOffsetStore)
 *
 * Stdout carries one JSON object per line, every "t_ms" the host's wall clock in milliseconds:
 *   {"event":"engine_start",...}  just before the engine runs
 *   {"event":"first",...}         the first change record arrived
 *   {"event":"progress",...}      at most once a second, with the counts so far
 *   {"event":"done",...}          the target was reached; the program then exits 0
 *   {"event":"stopped",...}       the engine stopped before the target (an error or the end of a snapshot); exit 1
 */

import java.io.FileReader;
import java.io.IOException;
import java.io.Reader;
import java.nio.ByteBuffer;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;

import org.apache.kafka.connect.data.Struct;
import org.apache.kafka.connect.json.JsonConverter;
import org.apache.kafka.connect.source.SourceRecord;
import org.apache.kafka.connect.storage.MemoryOffsetBackingStore;

import io.debezium.embedded.Connect;
import io.debezium.engine.DebeziumEngine;
import io.debezium.engine.RecordChangeEvent;
import io.debezium.engine.format.ChangeEventFormat;

public final class CountingEngine {

    private CountingEngine() {
    }

    public static void main(String[] args) throws Exception {
        Properties props = load(args[0]);
        Counter counter = new Counter(take(props, "bench.count"), Long.parseLong(take(props, "bench.target")));
        props.setProperty("database.password", System.getenv(take(props, "bench.password.env")));
        SeededOffsetStore.seed(props);
        DebeziumEngine<RecordChangeEvent<SourceRecord>> engine = DebeziumEngine.create(ChangeEventFormat.of(Connect.class))
                .using(props)
                .notifying(counter)
                .using((success, message, error) -> counter.stopped(message, error))
                .build();
        ExecutorService executor = Executors.newSingleThreadExecutor();
        Line.print("engine_start", counter.counts());
        executor.execute(engine);
        // Exit at once: closing the engine is not measured, and a stuck close must not hold the bench.
        System.exit(counter.await() ? 0 : 1);
    }

    private static Properties load(String path) throws IOException {
        Properties props = new Properties();
        try (Reader reader = new FileReader(path)) {
            props.load(reader);
        }
        return props;
    }

    static String take(Properties props, String key) {
        String value = (String) props.remove(key);
        if (value == null) {
            throw new IllegalArgumentException("missing property " + key);
        }
        return value;
    }

    /** Counts snapshot reads (op "r") and streamed changes (op "c", "u", "d") until the target is reached. */
    static final class Counter implements DebeziumEngine.ChangeConsumer<RecordChangeEvent<SourceRecord>> {
        private final boolean countSnapshot;
        private final long target;
        private final CountDownLatch finished = new CountDownLatch(1);
        private long snapshot;
        private long streaming;
        private long lastProgress;
        private volatile boolean reached;

        Counter(String kind, long target) {
            this.countSnapshot = "snapshot".equals(kind);
            this.target = target;
        }

        @Override
        public synchronized void handleBatch(List<RecordChangeEvent<SourceRecord>> records,
                                             DebeziumEngine.RecordCommitter<RecordChangeEvent<SourceRecord>> committer)
                throws InterruptedException {
            for (RecordChangeEvent<SourceRecord> record : records) {
                count(record.record().value());
                committer.markProcessed(record);
            }
            committer.markBatchFinished();
            report();
        }

        private void count(Object value) {
            if (!(value instanceof Struct) || ((Struct) value).schema().field("op") == null) {
                return; // not a row change: a schema change or a heartbeat
            }
            if (snapshot + streaming == 0) {
                Line.print("first", counts());
            }
            if ("r".equals(((Struct) value).getString("op"))) {
                snapshot++;
            }
            else {
                streaming++;
            }
        }

        private void report() {
            long counted = countSnapshot ? snapshot : streaming;
            if (counted >= target && !reached) {
                reached = true;
                Line.print("done", counts());
                finished.countDown();
            }
            else if (System.currentTimeMillis() - lastProgress >= 1000) {
                lastProgress = System.currentTimeMillis();
                Line.print("progress", counts());
            }
        }

        synchronized String counts() {
            return "\"snapshot\":" + snapshot + ",\"streaming\":" + streaming;
        }

        void stopped(String message, Throwable error) {
            if (!reached) {
                String cause = error == null ? "" : " " + error;
                Line.print("stopped", counts() + ",\"message\":" + Line.quote(message + cause));
            }
            finished.countDown();
        }

        boolean await() throws InterruptedException {
            finished.await();
            return reached;
        }
    }

    /**
     * The in-memory offset store, holding at start the offset that an earlier run of this engine would have
     * committed had it stopped at the given binlog position. With snapshot.mode=recovery the connector then
     * rebuilds its schema history from the tables as they are and streams from that position: a catch-up.
     */
    public static final class SeededOffsetStore extends MemoryOffsetBackingStore {
        private static final Map<ByteBuffer, ByteBuffer> SEED = new LinkedHashMap<>();

        public SeededOffsetStore() {
        }

        static void seed(Properties props) {
            if (!props.containsKey("bench.offset.file")) {
                return;
            }
            Map<String, Object> offset = new LinkedHashMap<>();
            offset.put("file", take(props, "bench.offset.file"));
            offset.put("pos", Long.parseLong(take(props, "bench.offset.pos")));
            offset.put("gtids", take(props, "bench.offset.gtids"));
            // The engine's offset key: [engine name, partition], both as JSON without schemas (Kafka Connect's form).
            List<Object> key = Arrays.asList(props.getProperty("name"), Map.of("server", props.getProperty("topic.prefix")));
            SEED.put(json(key), json(offset));
        }

        private static ByteBuffer json(Object value) {
            JsonConverter converter = new JsonConverter();
            converter.configure(Map.of("schemas.enable", "false"), true);
            return ByteBuffer.wrap(converter.fromConnectData("", null, value));
        }

        @Override
        public void start() {
            super.start();
            data.putAll(SEED);
        }

        @Override
        public java.util.Set<Map<String, Object>> connectorPartitions(String connectorName) {
            return java.util.Set.of();
        }
    }

    /** One JSON line on stdout, stamped with the wall clock. */
    static final class Line {
        private Line() {
        }

        static synchronized void print(String event, String fields) {
            System.out.println("{\"event\":\"" + event + "\",\"t_ms\":" + System.currentTimeMillis() + "," + fields + "}");
            System.out.flush();
        }

        static String quote(String text) {
            StringBuilder out = new StringBuilder("\"");
            for (char c : text.toCharArray()) {
                if (c == '"' || c == '\\') {
                    out.append('\\').append(c);
                }
                else if (c < 0x20) {
                    out.append(String.format("\\u%04x", (int) c));
                }
                else {
                    out.append(c);
                }
            }
            return out.append('"').toString();
        }
    }
}
