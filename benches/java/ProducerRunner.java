// The Java producer (org.apache.kafka:kafka-clients) as a peer of benches/throughput.py and
// benches/cpu_per_message.py; benches/_java.py compiles it at bench time and runs it.
//
//     java -cp JARS:CLASSES ProducerRunner BOOTSTRAP TOPIC MESSAGES WARM_UP_SECONDS [KEY=VALUE ...]
//
// Each pass sends MESSAGES of the benches' keyed 512-byte values (keys user-0 ... user-9999 in
// turn) as fast as send() takes them, then flush(): every ack waited for, its errors counted.
// KEY=VALUE are producer settings over the client's defaults. First warm-up passes, until the
// JIT has settled (its compiler threads took under 1% of the process's CPU in two passes in a
// row) or, after at least one pass, WARM_UP_SECONDS ran out; then the timed pass. Prints
// "timed" as the timed pass starts, then one JSON line: the timed and the last warm-up pass's
// wall and CPU seconds (the JVM's whole process, every thread: OperatingSystemMXBean's
// getProcessCpuTime), the part of that CPU its JIT compiler threads took (read from /proc:
// Linux), acks and errors, and how many warm-up passes ran. Neither the JVM's start nor the
// warm-up counts in the timed pass.
//
// Warming up until the JIT settles measures the producer as a long-running JVM runs it; a
// warm-up of a fixed count, or until one quiet pass, did not on a busy machine, where C2 was
// still compiling the send path in the timed pass (docs/performance.md).

import com.sun.management.OperatingSystemMXBean;
import java.io.IOException;
import java.lang.management.ManagementFactory;
import java.nio.charset.StandardCharsets;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.Path;
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
    private static final double SETTLED_JIT_SHARE = 0.01;
    private static final int SETTLED_PASSES = 2;
    /** The name (truncated by Linux to 15 characters) of HotSpot's C1 and C2 threads. */
    private static final String COMPILER_THREAD = "CompilerThre";

    /** One pass's figures: wall, process CPU and its JIT compilers' CPU seconds, acks and
     * errors. */
    private record Pass(double seconds, double cpu, double jitCpu, long acked, long failed) {
        boolean settled() {
            return jitCpu <= SETTLED_JIT_SHARE * cpu;
        }

        String json() {
            return String.format(
                    Locale.ROOT,
                    "{\"seconds\": %.6f, \"cpu\": %.6f, \"jit_cpu\": %.6f, \"acked\": %d, "
                            + "\"failed\": %d}",
                    seconds, cpu, jitCpu, acked, failed);
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
            int settled = 0;
            do {
                warm = send(producer, topic, keys, value, messages);
                passes++;
                settled = warm.settled() ? settled + 1 : 0;
            } while (settled < SETTLED_PASSES && System.nanoTime() < warmUpEnds);
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
        Acks acks = new Acks();
        long[] ticks = ticks();
        long cpu = system.getProcessCpuTime();
        long started = System.nanoTime();
        for (int i = 0; i < count; i++) {
            producer.send(new ProducerRecord<>(topic, keys[i % keys.length], value), acks);
        }
        producer.flush();
        long wall = System.nanoTime() - started;
        cpu = system.getProcessCpuTime() - cpu;
        long[] after = ticks();
        long processTicks = after[0] - ticks[0];
        double jitShare = processTicks > 0 ? (double) (after[1] - ticks[1]) / processTicks : 0;
        return new Pass(wall / 1e9, cpu / 1e9, jitShare * cpu / 1e9, acks.acked.get(),
                acks.failed.get());
    }

    /** The process's CPU clock ticks so far and its compiler threads' (user + system, from
     * /proc: a compiler thread that ended takes its ticks with it); zeros where /proc is not
     * there. */
    private static long[] ticks() {
        long[] ticks = new long[2];
        ticks[0] = ticksOf(Path.of("/proc/self/stat"));
        try (DirectoryStream<Path> tasks = Files.newDirectoryStream(Path.of("/proc/self/task"))) {
            for (Path task : tasks) {
                if (Files.readString(task.resolve("comm")).contains(COMPILER_THREAD)) {
                    ticks[1] += ticksOf(task.resolve("stat"));
                }
            }
        } catch (IOException e) {
            return new long[2];
        }
        return ticks;
    }

    /** utime + stime of a /proc stat file (0 for a thread that has ended). */
    private static long ticksOf(Path stat) {
        try {
            String text = Files.readString(stat);
            String[] fields = text.substring(text.lastIndexOf(')') + 2).split(" ");
            return Long.parseLong(fields[11]) + Long.parseLong(fields[12]);
        } catch (IOException e) {
            return 0;
        }
    }
}
