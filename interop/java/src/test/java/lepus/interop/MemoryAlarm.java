package lepus.interop;

import static org.junit.jupiter.api.Assertions.fail;

import com.rabbitmq.client.Connection;
import com.rabbitmq.client.ConnectionFactory;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.TimeUnit;

/**
 * A broker whose memory alarm is raised, to observe connection.blocked for real. RabbitMQ: the
 * node's watermark goes to 0 through {@code $RABBITMQCTL} (a command prefix) and back on
 * {@link #clear()} / {@link #close()}. Lepus cannot change its watermark at run time, so a private
 * {@code $LEPUS_BIN server} starts with a 1-byte watermark; {@link #canClear()} is then false
 * (the Python suite's disk-alarm test covers clearing on Lepus).
 */
final class MemoryAlarm implements AutoCloseable {

    private static final long START_TIMEOUT_MS = 10_000;

    private final ConnectionFactory factory;
    private final Process lepus;
    private final String watermark;
    private boolean cleared;

    private MemoryAlarm(ConnectionFactory factory, Process lepus, String watermark) {
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
            lepus.destroyForcibly().waitFor(10, TimeUnit.SECONDS);
        } else {
            clear();
        }
    }

    private static MemoryAlarm startLepus() throws Exception {
        String binary = System.getenv("LEPUS_BIN");
        if (binary == null || binary.isBlank()) {
            fail("the broker is Lepus: set LEPUS_BIN so this test can start a broker with its memory alarm raised");
        }
        Path directory = Files.createTempDirectory("lepus-java-alarm");
        int port;
        try (ServerSocket socket = new ServerSocket(0, 1, java.net.InetAddress.getLoopbackAddress())) {
            port = socket.getLocalPort();
        }
        ProcessBuilder builder = new ProcessBuilder(binary, "server", "--data-dir", directory.resolve("data").toString(),
                "--amqp-port", Integer.toString(port), "--bind", "127.0.0.1", "--http-port", "0", "--metrics-port", "0");
        builder.environment().put("LEPUS_MEMORY_HIGH_WATERMARK_BYTES", "1");
        builder.redirectErrorStream(true).redirectOutput(directory.resolve("lepus.log").toFile());
        Process process = builder.start();
        long deadline = System.currentTimeMillis() + START_TIMEOUT_MS;
        while (true) {
            try (Socket probe = new Socket()) {
                probe.connect(new InetSocketAddress("127.0.0.1", port), 1_000);
                break;
            } catch (IOException notYet) {
                if (!process.isAlive() || System.currentTimeMillis() > deadline) {
                    process.destroyForcibly();
                    fail("lepus did not listen on " + port + ":\n" + Files.readString(directory.resolve("lepus.log")));
                }
                Thread.sleep(50);
            }
        }
        ConnectionFactory factory = Broker.factory();
        factory.setHost("127.0.0.1");
        factory.setPort(port);
        factory.setVirtualHost("/");
        return new MemoryAlarm(factory, process, null);
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
