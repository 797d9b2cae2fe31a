// The Java producer (org.apache.kafka:kafka-clients) as a peer of benches/throughput.py and
// benches/cpu_per_message.py; benches/_java.py compiles it at bench time and runs it.
//
//     java -cp JARS:CLASSES ProducerRunner BOOTSTRAP TOPIC MESSAGES WARM_UP_SECONDS [KEY=VALUE ...]
//
// Each pass sends MESSAGES of the benches' keyed 512-byte values (keys user-0 ... user-9999 in
// turn) as fast as send() takes them, then flush(): every ack waited for, its errors counted.
// KEY=VALUE are producer settings over the client's defaults. First warm-up passes, until one
// in which the JIT compiled (almost) nothing (its compilers' time under 1% of the pass's CPU)
// or, after at least one, until WARM_UP_SECONDS or MAX_WARM_UP_PASSES ran out; then the timed
// pass. Prints "timed" as the timed pass starts, then one JSON line: each of the two passes'
// wall and CPU seconds (the JVM's whole process, every thread: OperatingSystemMXBean's
// getProcessCpuTime), the JIT's seconds, acks and errors, and how many warm-up passes ran.
// Neither the JVM's start nor the warm-up counts in the timed pass.
//
// Warming up until the JIT settles measures the producer as a long-running JVM runs it; a
// warm-up of a fixed count did not on a busy machine, where C2 was still compiling the send
// path in the timed pass (docs/performance.md).

import com.sun.management.OperatingSystemMXBean;
import java.lang.management.CompilationMXBean;
import java.lang.management.ManagementFactory;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.Locale;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.clients.producer.Callback;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public final class ProducerRunner {
    private static final int VALUE_BYTES = 512;
    private static final int DISTINCT_KEYS = 10_000;
    private static final int MAX_WARM_UP_PASSES = 30;
    private static final double SETTLED_JIT_SHARE = 0.01;

    /** One pass's figures: wall, process CPU and JIT seconds, acks and errors. */
    private record Pass(double seconds, double cpu, double jit, long acked, long failed) {
        String json() {
            return String.format(
                    Locale.ROOT,
                    "{\"seconds\": %.6f, \"cpu\": %.6f, \"jit\": %.3f, \"acked\": %d, "
                            + "\"failed\": %d}",
                    seconds, cpu, jit, acked, failed);
        }
    }

    /** Counts the acks and the errors of one pass (called on the producer's I/O thread). */
    private static final class Acks implements Callback {
        final AtomicLong acked = new AtomicLong();
        final AtomicLong failed = new AtomicLong();

        @Override
        public void onCompletion(RecordMetadata metadata, Exception exception) {
            (exception == null ? acked : failed).incrementAndGet();
        }
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 4) {
            System.err.println("usage: ProducerRunner BOOTSTRAP TOPIC MESSAGES WARM_UP_SECONDS"
                    + " [KEY=VALUE ...]");
            System.exit(2);
        }
        String topic = args[1];
        int messages = Integer.parseInt(args[2]);
        long warmUpEnds = System.nanoTime() + (long) (Double.parseDouble(args[3]) * 1e9);
        Properties settings = new Properties();
        settings.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        settings.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class);
        settings.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class);
        for (int i = 4; i < args.length; i++) {
            String[] setting = args[i].split("=", 2);
            settings.put(setting[0], setting[1]);
        }
        byte[] value = new byte[VALUE_BYTES];
        Arrays.fill(value, (byte) 'x');
        byte[][] keys = new byte[DISTINCT_KEYS][];
        for (int i = 0; i < DISTINCT_KEYS; i++) {
            keys[i] = ("user-" + i).getBytes(StandardCharsets.US_ASCII);
        }
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(settings)) {
            Pass warm;
            int passes = 0;
            do {
                warm = send(producer, topic, keys, value, messages);
                passes++;
            } while (warm.jit() > SETTLED_JIT_SHARE * warm.cpu()
                    && passes < MAX_WARM_UP_PASSES && System.nanoTime() < warmUpEnds);
            System.out.println("timed");
            System.out.flush();
            Pass timed = send(producer, topic, keys, value, messages);
            System.out.println(String.format(
                    Locale.ROOT,
                    "{\"messages\": %d, \"timed\": %s, \"last_warm_up\": %s, "
                            + "\"warm_up_passes\": %d}",
                    messages, timed.json(), warm.json(), passes));
            System.out.flush();
        }
    }

    private static Pass send(KafkaProducer<byte[], byte[]> producer, String topic,
            byte[][] keys, byte[] value, int count) {
        OperatingSystemMXBean system =
                (OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean();
        CompilationMXBean jit = ManagementFactory.getCompilationMXBean();
        Acks acks = new Acks();
        long compiling = jit.getTotalCompilationTime();
        long cpu = system.getProcessCpuTime();
        long started = System.nanoTime();
        for (int i = 0; i < count; i++) {
            producer.send(new ProducerRecord<>(topic, keys[i % keys.length], value), acks);
        }
        producer.flush();
        long wall = System.nanoTime() - started;
        cpu = system.getProcessCpuTime() - cpu;
        compiling = jit.getTotalCompilationTime() - compiling;
        return new Pass(wall / 1e9, cpu / 1e9, compiling / 1e3, acks.acked.get(),
                acks.failed.get());
    }
}
