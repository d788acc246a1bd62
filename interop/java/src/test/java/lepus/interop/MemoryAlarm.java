package lepus.interop;

import static org.junit.jupiter.api.Assertions.fail;

import com.rabbitmq.client.Connection;
import com.rabbitmq.client.ConnectionFactory;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;

/**
 * A broker whose memory alarm is raised, to observe connection.blocked for real. RabbitMQ: the
 * node's watermark goes to 0 through {@code $RABBITMQCTL} (a command prefix) and back on
 * {@link #clear()} / {@link #close()}. Lepus cannot change its watermark at run time, so a private
 * {@code $LEPUS_BIN server} starts with a 1-byte watermark; {@link #canClear()} is then false
 * (the Python suite's disk-alarm test covers clearing on Lepus).
 */
final class MemoryAlarm implements AutoCloseable {

    private final ConnectionFactory factory;
    private final PrivateLepus lepus;
    private final String watermark;
    private boolean cleared;

    private MemoryAlarm(ConnectionFactory factory, PrivateLepus lepus, String watermark) {
        this.factory = factory;
        this.lepus = lepus;
        this.watermark = watermark;
    }

    static MemoryAlarm raise() throws Exception {
        String product;
        try (Connection c = Broker.connect()) {
            product = String.valueOf(c.getServerProperties().get("product"));
        }
        if (product.equals("Lepus")) {
            return startLepus();
        }
        String watermark = rabbitmqctl("eval", "vm_memory_monitor:get_vm_memory_high_watermark().").trim();
        if (!watermark.matches("[0-9.]+")) {
            fail("unexpected memory watermark " + watermark);
        }
        rabbitmqctl("set_vm_memory_high_watermark", "0");
        return new MemoryAlarm(Broker.factory(), null, watermark);
    }

    ConnectionFactory factory() {
        return factory;
    }

    boolean canClear() {
        return watermark != null;
    }

    void clear() throws Exception {
        if (watermark != null && !cleared) {
            cleared = true;
            rabbitmqctl("set_vm_memory_high_watermark", watermark);
        }
    }

    @Override
    public void close() throws Exception {
        if (lepus != null) {
            lepus.close();
        } else {
            clear();
        }
    }

    private static MemoryAlarm startLepus() throws Exception {
        PrivateLepus lepus = PrivateLepus.start(Map.of("LEPUS_MEMORY_HIGH_WATERMARK_BYTES", "1"));
        return new MemoryAlarm(lepus.factory(), lepus, null);
    }

    private static String rabbitmqctl(String... args) throws Exception {
        String prefix = System.getenv("RABBITMQCTL");
        if (prefix == null || prefix.isBlank()) {
            fail("the broker is RabbitMQ: set RABBITMQCTL (e.g. 'rabbitmqctl -n node@localhost') for this test");
        }
        List<String> command = new ArrayList<>(Arrays.asList(prefix.trim().split("\\s+")));
        command.addAll(Arrays.asList(args));
        Process process = new ProcessBuilder(command).redirectErrorStream(true).start();
        String output = new String(process.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
        if (!process.waitFor(60, TimeUnit.SECONDS) || process.exitValue() != 0) {
            fail(String.join(" ", command) + " failed:\n" + output);
        }
        return output;
    }
}
