package lepus.interop;

import static org.junit.jupiter.api.Assertions.fail;

import com.rabbitmq.client.ConnectionFactory;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;

/**
 * A {@code $LEPUS_BIN server} of a test's own, on a free port and a fresh data directory, for
 * settings the shared broker does not have (a node-wide memory watermark, a consumer timeout).
 * Stopped with {@link #close()}.
 */
final class PrivateLepus implements AutoCloseable {

    private static final long START_TIMEOUT_MS = 10_000;

    private final Process process;
    private final ConnectionFactory factory;

    private PrivateLepus(Process process, ConnectionFactory factory) {
        this.process = process;
        this.factory = factory;
    }

    /** Starts one with `environment` set and `extraArguments` after the listener flags. */
    static PrivateLepus start(Map<String, String> environment, String... extraArguments) throws Exception {
        String binary = System.getenv("LEPUS_BIN");
        if (binary == null || binary.isBlank()) {
            fail("the broker is Lepus: set LEPUS_BIN so this test can start a broker of its own");
        }
        Path directory = Files.createTempDirectory("lepus-java-private");
        int port;
        try (ServerSocket socket = new ServerSocket(0, 1, java.net.InetAddress.getLoopbackAddress())) {
            port = socket.getLocalPort();
        }
        List<String> command = new ArrayList<>(List.of(binary, "server", "--data-dir", directory.resolve("data").toString(),
                "--amqp-port", Integer.toString(port), "--bind", "127.0.0.1", "--http-port", "0", "--metrics-port", "0",
                "--stream-port", "0"));
        command.addAll(List.of(extraArguments));
        ProcessBuilder builder = new ProcessBuilder(command);
        builder.environment().putAll(environment);
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
        return new PrivateLepus(process, factory);
    }

    ConnectionFactory factory() {
        return factory;
    }

    @Override
    public void close() throws Exception {
        process.destroyForcibly().waitFor(10, TimeUnit.SECONDS);
    }
}
