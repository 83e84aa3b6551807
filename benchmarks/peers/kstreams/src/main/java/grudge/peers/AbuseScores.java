package grudge.peers;

import java.lang.management.ManagementFactory;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.processor.PunctuationType;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.processor.api.RecordMetadata;
import org.apache.kafka.streams.state.KeyValueIterator;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.StoreBuilder;
import org.apache.kafka.streams.state.Stores;

/**
 * The grudge-stream {@code abuse_scores} job, exact per key, as a Kafka Streams application.
 *
 * <p>Processor API, one persistent (RocksDB) key-value store {@code scores} holding, per client,
 * {@code (score: double, last_ms: long)} and whether the client is raised, with its changelog (the
 * default) and record caching (enabled on the store, sized by {@code statestore.cache.max.bytes}),
 * plus a store {@code raised} of the raised clients for the sweep. Semantics are those of
 * {@code FeedbackScoreOperator} (grudge_stream/operators/scores.py) with an exact score in place of
 * the sketch:
 * <ul>
 *   <li>{@code {"outcome":"bad"}} adds 0.04, {@code {"outcome":"good"}} adds -0.001 (anything else
 *       is skipped: a dead letter in grudge-stream);</li>
 *   <li>the score decays as exp(-lambda * dt) in event time (the record timestamp); an event older
 *       than the key's reference time is applied at that time with its delta weighted by
 *       exp(-lambda * lateness); the result is clamped to [0, 1];</li>
 *   <li>a client is raised when its score reaches 0.5 and cleared when it falls to 0.25 or below;
 *       every {@code sweep_ms} of stream time (a stream-time punctuator) the raised clients are
 *       re-read and those that decayed to 0.25 or below are cleared;</li>
 *   <li>each crossing is one JSON alert on the alerts topic, with the source partition, offset and
 *       event time.</li>
 * </ul>
 *
 * <p>Benchmark instrumentation only (no effect on processing): the first record processed prints
 * {@code FIRST <epoch_ms> <process_cpu_ns>} and the {@code --expected}-th prints
 * {@code DONE <records> <epoch_ms> <process_cpu_ns>}, both on stdout.
 */
public final class AbuseScores {
    static final byte[] BAD = "{\"outcome\":\"bad\"}".getBytes(StandardCharsets.UTF_8);
    static final byte[] GOOD = "{\"outcome\":\"good\"}".getBytes(StandardCharsets.UTF_8);

    static final AtomicLong COUNT = new AtomicLong();
    static final AtomicBoolean FIRST = new AtomicBoolean();
    static long expected = Long.MAX_VALUE;

    static long cpuNanos() {
        return ((com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean())
                .getProcessCpuTime();
    }

    static void counted() {
        if (FIRST.compareAndSet(false, true)) {
            System.out.println("FIRST " + System.currentTimeMillis() + " " + cpuNanos());
            System.out.flush();
        }
        long n = COUNT.incrementAndGet();
        if (n == expected) {
            System.out.println("DONE " + n + " " + System.currentTimeMillis() + " " + cpuNanos());
            System.out.flush();
        }
    }

    /** Value layout: score (double), reference time (long ms), raised (byte); little-endian. */
    static byte[] pack(double score, long lastMs, boolean raised) {
        return ByteBuffer.allocate(17).order(ByteOrder.LITTLE_ENDIAN)
                .putDouble(score).putLong(lastMs).put((byte) (raised ? 1 : 0)).array();
    }

    static final class ScoreProcessor implements Processor<byte[], byte[], byte[], byte[]> {
        private final double lamPerMs, bad, good, raiseAt, clearAt;
        private final long sweepMs;
        private ProcessorContext<byte[], byte[]> ctx;
        private KeyValueStore<Bytes, byte[]> scores;
        private KeyValueStore<Bytes, byte[]> raised;

        ScoreProcessor(double decayPerS, double bad, double good, double raiseAt, double clearAt, long sweepMs) {
            this.lamPerMs = decayPerS / 1000.0;
            this.bad = bad;
            this.good = good;
            this.raiseAt = raiseAt;
            this.clearAt = clearAt;
            this.sweepMs = sweepMs;
        }

        @Override
        public void init(ProcessorContext<byte[], byte[]> context) {
            ctx = context;
            scores = context.getStateStore("scores");
            raised = context.getStateStore("raised");
            context.schedule(Duration.ofMillis(sweepMs), PunctuationType.STREAM_TIME, this::sweep);
        }

        private Double delta(byte[] v) {
            if (v == null) return null;
            if (Arrays.equals(v, BAD)) return bad;
            if (Arrays.equals(v, GOOD)) return good;
            String s = new String(v, StandardCharsets.UTF_8).replace(" ", "");
            if (s.contains("\"outcome\":\"bad\"")) return bad;
            if (s.contains("\"outcome\":\"good\"")) return good;
            return null;
        }

        @Override
        public void process(Record<byte[], byte[]> rec) {
            Double d = delta(rec.value());
            if (d != null && rec.key() != null) {
                long ts = rec.timestamp();
                Bytes key = Bytes.wrap(rec.key());
                byte[] old = scores.get(key);
                double score = 0.0, delta = d;
                long last = ts;
                boolean isRaised = false;
                if (old != null) {
                    ByteBuffer b = ByteBuffer.wrap(old).order(ByteOrder.LITTLE_ENDIAN);
                    score = b.getDouble();
                    last = b.getLong();
                    isRaised = b.get() != 0;
                }
                if (ts >= last) {
                    score *= Math.exp(-lamPerMs * (ts - last));
                    last = ts;
                } else {
                    delta *= Math.exp(-lamPerMs * (last - ts));
                }
                score = Math.min(1.0, Math.max(0.0, score + delta));
                String state = null;
                if (isRaised) {
                    if (score <= clearAt) {
                        isRaised = false;
                        state = "cleared";
                        raised.delete(key);
                    }
                } else if (score >= raiseAt) {
                    isRaised = true;
                    state = "raised";
                    raised.put(key, pack(score, last, true));
                }
                scores.put(key, pack(score, last, isRaised));
                if (state != null) alert(rec.key(), state, score, last, rec.timestamp());
            }
            counted();
        }

        private void alert(byte[] key, String state, double score, long eventMs, long recordTs) {
            RecordMetadata m = ctx.recordMetadata().orElse(null);
            String body = "{\"key\":\"" + new String(key, StandardCharsets.UTF_8) + "\",\"state\":\"" + state
                    + "\",\"score\":" + score + ",\"event_time_ms\":" + eventMs
                    + ",\"source\":{\"partition\":" + (m == null ? -1 : m.partition())
                    + ",\"offset\":" + (m == null ? -1 : m.offset()) + "}}";
            ctx.forward(new Record<>(key, body.getBytes(StandardCharsets.UTF_8), recordTs));
        }

        /** Re-read the raised clients at stream time and clear those that decayed. */
        private void sweep(long now) {
            List<KeyValue<Bytes, byte[]>> cleared = new ArrayList<>();
            try (KeyValueIterator<Bytes, byte[]> it = raised.all()) {
                while (it.hasNext()) {
                    KeyValue<Bytes, byte[]> kv = it.next();
                    byte[] cur = scores.get(kv.key);
                    if (cur == null) continue;
                    ByteBuffer b = ByteBuffer.wrap(cur).order(ByteOrder.LITTLE_ENDIAN);
                    double score = b.getDouble();
                    long last = b.getLong();
                    double s = now > last ? score * Math.exp(-lamPerMs * (now - last)) : score;
                    if (s <= clearAt) cleared.add(KeyValue.pair(kv.key, pack(s, last, false)));
                }
            }
            for (KeyValue<Bytes, byte[]> kv : cleared) {
                raised.delete(kv.key);
                byte[] cur = scores.get(kv.key);
                ByteBuffer b = ByteBuffer.wrap(cur).order(ByteOrder.LITTLE_ENDIAN);
                double score = b.getDouble();
                long last = b.getLong();
                scores.put(kv.key, pack(score, last, false));
                double s = score * Math.exp(-lamPerMs * Math.max(0, now - last));
                alert(kv.key.get(), "cleared", s, now, now);
            }
        }
    }

    static Map<String, String> parse(String[] args) {
        Map<String, String> m = new HashMap<>();
        for (int i = 0; i + 1 < args.length; i += 2) {
            if (!args[i].startsWith("--")) throw new IllegalArgumentException("bad argument " + args[i]);
            m.put(args[i].substring(2), args[i + 1]);
        }
        return m;
    }

    public static void main(String[] argv) throws Exception {
        Map<String, String> a = parse(argv);
        String source = a.get("topic");
        String alerts = a.getOrDefault("alerts-topic", a.get("app-id") + "-alerts");
        expected = Long.parseLong(a.getOrDefault("expected", String.valueOf(Long.MAX_VALUE)));
        double decay = Double.parseDouble(a.getOrDefault("decay-per-s", "0.01"));
        long sweepMs = Long.parseLong(a.getOrDefault("sweep-ms", "10000"));

        Properties p = new Properties();
        p.put(StreamsConfig.APPLICATION_ID_CONFIG, a.get("app-id"));
        p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, a.get("bootstrap"));
        p.put(StreamsConfig.STATE_DIR_CONFIG, a.get("state-dir"));
        p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG,
                "true".equals(a.get("eos")) ? StreamsConfig.EXACTLY_ONCE_V2 : StreamsConfig.AT_LEAST_ONCE);
        p.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, a.getOrDefault("commit-ms", "5000"));
        p.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, a.getOrDefault("cache-bytes", "10485760"));
        p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, a.getOrDefault("threads", "1"));
        p.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, "1");
        p.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");
        if (a.containsKey("instance-id")) {
            // static membership: a restarted instance takes its partitions back at once
            p.put(StreamsConfig.consumerPrefix("group.instance.id"), a.get("instance-id"));
        }

        StoreBuilder<KeyValueStore<Bytes, byte[]>> scores = Stores.keyValueStoreBuilder(
                Stores.persistentKeyValueStore("scores"), Serdes.Bytes(), Serdes.ByteArray())
                .withCachingEnabled();
        StoreBuilder<KeyValueStore<Bytes, byte[]>> raised = Stores.keyValueStoreBuilder(
                Stores.persistentKeyValueStore("raised"), Serdes.Bytes(), Serdes.ByteArray())
                .withCachingEnabled();

        Topology t = new Topology();
        t.addSource("events", Serdes.ByteArray().deserializer(), Serdes.ByteArray().deserializer(), source);
        t.addProcessor("score", () -> new ScoreProcessor(decay, 0.04, -0.001, 0.5, 0.25, sweepMs), "events");
        t.addStateStore(scores, "score");
        t.addStateStore(raised, "score");
        t.addSink("alerts", alerts, Serdes.ByteArray().serializer(), Serdes.ByteArray().serializer(), "score");

        KafkaStreams streams = new KafkaStreams(t, p);
        CountDownLatch stop = new CountDownLatch(1);
        streams.setStateListener((now, before) -> {
            System.out.println("STATE " + now + " " + System.currentTimeMillis());
            System.out.flush();
            if (now == KafkaStreams.State.ERROR || now == KafkaStreams.State.NOT_RUNNING) stop.countDown();
        });
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            streams.close(Duration.ofSeconds(60));
            stop.countDown();
        }));
        System.out.println("START " + System.currentTimeMillis());
        System.out.flush();
        streams.start();
        stop.await();
    }
}
