package lepus.streams;

import com.rabbitmq.stream.Address;
import com.rabbitmq.stream.ByteCapacity;
import com.rabbitmq.stream.Environment;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.net.URI;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.UUID;

/** The broker under test: its stream URL, environments on it, and a restart when possible. */
final class Broker {
  static final Duration WAIT = Duration.ofSeconds(10);

  private Broker() {}

  /** The broker under test, from STREAM_URL. */
  static String url() {
    String url = System.getenv("STREAM_URL");
    return url == null || url.isEmpty() ? "rabbitmq-stream://guest:guest@127.0.0.1:5552/%2f" : url;
  }

  /**
   * An environment on {@code url} whose every connection (the locator's, the leader's) goes to
   * the URL's address, whatever host the broker advertises.
   */
  static Environment environment(String url) {
    URI uri = URI.create(url);
    Address entry = new Address(uri.getHost(), uri.getPort());
    return Environment.builder().uri(url).addressResolver(address -> entry).rpcTimeout(WAIT).build();
  }

  static String streamName(String test) {
    return "lepus.java-stream." + test + "." + UUID.randomUUID().toString().substring(0, 8);
  }

  static String declare(Environment environment, String test) {
    String name = streamName(test);
    environment.streamCreator().stream(name).maxLengthBytes(ByteCapacity.MB(100)).create();
    return name;
  }

  /** A broker the test may restart, or null when there is none (the test then skips). */
  static Restartable restartable() throws IOException, InterruptedException {
    String bin = System.getenv("LEPUS_BIN");
    if (bin != null && !bin.isEmpty()) {
      return new OwnLepus(bin);
    }
    String ctl = System.getenv("RABBITMQCTL");
    if (ctl != null && !ctl.isEmpty()) {
      return new Restartable() {
        public String url() {
          return Broker.url();
        }

        public void restart() throws IOException, InterruptedException {
          run(ctl, "stop_app");
          run(ctl, "start_app");
          waitListening(url());
        }

        public void close() {}
      };
    }
    return null;
  }

  interface Restartable extends AutoCloseable {
    String url();

    void restart() throws IOException, InterruptedException;

    @Override
    void close() throws IOException, InterruptedException;
  }

  private static void run(String prefix, String action) throws IOException, InterruptedException {
    List<String> command = new ArrayList<>(Arrays.asList(prefix.trim().split("\\s+")));
    command.add(action);
    Process process = new ProcessBuilder(command).redirectErrorStream(true).start();
    String output = new String(process.getInputStream().readAllBytes());
    if (process.waitFor() != 0) {
      throw new IOException(command + " failed: " + output);
    }
  }

  static void waitListening(String url) throws InterruptedException, IOException {
    URI uri = URI.create(url);
    long deadline = System.nanoTime() + Duration.ofSeconds(60).toNanos();
    while (System.nanoTime() < deadline) {
      try (Socket socket = new Socket()) {
        socket.connect(new InetSocketAddress(uri.getHost(), uri.getPort()), 1000);
        // Listening; give the broker a moment to finish booting its streams.
        Thread.sleep(500);
        return;
      } catch (IOException notYet) {
        Thread.sleep(100);
      }
    }
    throw new IOException("nothing listens on " + uri.getHost() + ":" + uri.getPort() + " after 60 s");
  }

  static int freePort() throws IOException {
    try (ServerSocket socket = new ServerSocket(0)) {
      return socket.getLocalPort();
    }
  }

  /** A Lepus of the suite's own, on free ports and a temporary data directory. */
  static final class OwnLepus implements Restartable {
    private final String bin;
    private final Path dataDir;
    private final int amqpPort;
    private final int streamPort;
    private Process process;

    OwnLepus(String bin) throws IOException, InterruptedException {
      this.bin = bin;
      this.dataDir = Files.createTempDirectory("lepus-java-stream");
      this.amqpPort = freePort();
      this.streamPort = freePort();
      start();
    }

    public String url() {
      return "rabbitmq-stream://guest:guest@127.0.0.1:" + streamPort + "/%2f";
    }

    private void start() throws IOException, InterruptedException {
      process =
          new ProcessBuilder(
                  bin, "server", "--data-dir", dataDir.toString(), "--bind", "127.0.0.1",
                  "--amqp-port", String.valueOf(amqpPort), "--stream-port", String.valueOf(streamPort),
                  "--stream-advertised-host", "127.0.0.1", "--http-port", "0", "--metrics-port", "0")
              .inheritIO()
              .start();
      waitListening(url());
    }

    private void stop() throws InterruptedException {
      if (process != null) {
        process.destroy();
        process.waitFor();
        process = null;
      }
    }

    public void restart() throws IOException, InterruptedException {
      stop();
      start();
    }

    public void close() throws InterruptedException {
      stop();
    }
  }
}
