package lepus.streams;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import com.rabbitmq.stream.ByteCapacity;
import com.rabbitmq.stream.ConfirmationStatus;
import com.rabbitmq.stream.Constants;
import com.rabbitmq.stream.Consumer;
import com.rabbitmq.stream.Environment;
import com.rabbitmq.stream.NoOffsetException;
import com.rabbitmq.stream.OffsetSpecification;
import com.rabbitmq.stream.Producer;
import com.rabbitmq.stream.StreamDoesNotExistException;
import com.rabbitmq.stream.StreamException;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInfo;
import org.junit.jupiter.api.Timeout;

/** RabbitMQ's Java stream client against the broker's stream port. */
class StreamTest {
  private Environment environment;
  private final List<String> streams = new ArrayList<>();
  /** Consumers the test opened: closed before their streams are deleted (a stream deleted under a
   * subscription makes the client try to resubscribe, and its close then waits 30 s for it). */
  private final List<Consumer> consumers = new ArrayList<>();
  /** Producers the test opened, closed first for the same reason: the Java client deadlocks
   * (ProducersCoordinator, two locks taken in opposite orders) when the environment closes a
   * producer whose stream RabbitMQ just deleted. */
  private final List<Producer> producers = new ArrayList<>();
  private String test;

  @BeforeEach
  void open(TestInfo info) {
    test = info.getTestMethod().map(method -> method.getName()).orElse("test");
    environment = Broker.environment(Broker.url());
  }

  @AfterEach
  void close() {
    for (Producer producer : producers) {
      producer.close();
    }
    for (Consumer consumer : consumers) {
      consumer.close();
    }
    for (String stream : streams) {
      try {
        environment.deleteStream(stream);
      } catch (StreamException alreadyGone) {
        // deleted by the test
      }
    }
    environment.close();
  }

  private Producer track(Producer producer) {
    producers.add(producer);
    return producer;
  }

  private String declared() {
    String name = Broker.declare(environment, test);
    streams.add(name);
    return name;
  }

  private static byte[] bytes(String text) {
    return text.getBytes(StandardCharsets.UTF_8);
  }

  /** Sends each body and waits for its confirm before the next: one chunk per message. */
  private static void publishOneByOne(Producer producer, String... bodies) throws InterruptedException {
    for (String body : bodies) {
      CountDownLatch confirmed = new CountDownLatch(1);
      List<ConfirmationStatus> statuses = new CopyOnWriteArrayList<>();
      producer.send(producer.messageBuilder().addData(bytes(body)).build(), status -> {
        statuses.add(status);
        confirmed.countDown();
      });
      assertTrue(confirmed.await(10, TimeUnit.SECONDS), "confirm of " + body);
      assertTrue(statuses.get(0).isConfirmed(), "confirmed " + body + ": code " + statuses.get(0).getCode());
    }
  }

  private static String[] bodies(String prefix, int from, int to) {
    String[] out = new String[to - from];
    for (int i = from; i < to; i++) {
      out[i - from] = prefix + "-" + i;
    }
    return out;
  }

  /** What a consumer received: bodies and offsets. */
  private static final class Received {
    final List<String> bodies = new CopyOnWriteArrayList<>();
    final List<Long> offsets = new CopyOnWriteArrayList<>();

    void await(int count) throws InterruptedException {
      long deadline = System.nanoTime() + Duration.ofSeconds(10).toNanos();
      while (bodies.size() < count && System.nanoTime() < deadline) {
        Thread.sleep(20);
      }
      // Nothing more may follow.
      Thread.sleep(500);
    }
  }

  private Received consume(String stream, OffsetSpecification offset) {
    Received received = new Received();
    consumers.add(environment.consumerBuilder().stream(stream).offset(offset).messageHandler((context, message) -> {
      received.offsets.add(context.offset());
      received.bodies.add(new String(message.getBodyAsBinary(), StandardCharsets.UTF_8));
    }).build());
    return received;
  }

  private static List<Long> offsets(long first, int count) {
    List<Long> out = new ArrayList<>();
    for (int i = 0; i < count; i++) {
      out.add(first + i);
    }
    return out;
  }

  private static int code(Throwable error) {
    for (Throwable cause = error; cause != null; cause = cause.getCause()) {
      if (cause instanceof StreamException && ((StreamException) cause).getCode() != -1) {
        return ((StreamException) cause).getCode();
      }
    }
    return -1;
  }

  @Test
  void createAndDeleteAndTheirRefusals() {
    String name = Broker.streamName(test);
    streams.add(name);
    environment.streamCreator().stream(name).maxAge(Duration.ofHours(1)).maxLengthBytes(ByteCapacity.GB(1)).create();
    assertTrue(environment.streamExists(name));
    // STREAM_ALREADY_EXISTS for the same arguments, which the client takes as done.
    environment.streamCreator().stream(name).maxAge(Duration.ofHours(1)).maxLengthBytes(ByteCapacity.GB(1)).create();
    StreamException other = assertThrows(StreamException.class,
        () -> environment.streamCreator().stream(name).maxLengthBytes(ByteCapacity.GB(2)).create());
    assertEquals(Constants.RESPONSE_CODE_PRECONDITION_FAILED, code(other), "other arguments: " + other);
    StreamException amq = assertThrows(StreamException.class, () -> environment.streamCreator().stream("amq.lepus-java-stream").create());
    assertEquals(Constants.RESPONSE_CODE_PRECONDITION_FAILED, code(amq), "an amq. name: " + amq);
    environment.deleteStream(name);
    assertFalse(environment.streamExists(name));
    StreamException gone = assertThrows(StreamException.class, () -> environment.deleteStream(name));
    assertEquals(Constants.RESPONSE_CODE_STREAM_DOES_NOT_EXIST, code(gone), gone.toString());
  }

  @Test
  void publishWithConfirmsAndConsumeFromFirst() throws InterruptedException {
    String stream = declared();
    Producer producer = track(environment.producerBuilder().stream(stream).build());
    int count = 1000;
    CountDownLatch confirmed = new CountDownLatch(count);
    AtomicInteger refused = new AtomicInteger();
    for (int i = 0; i < count; i++) {
      producer.send(producer.messageBuilder().addData(bytes("m-" + i)).build(), status -> {
        if (!status.isConfirmed()) {
          refused.incrementAndGet();
        }
        confirmed.countDown();
      });
    }
    assertTrue(confirmed.await(10, TimeUnit.SECONDS), "confirms: " + confirmed.getCount() + " missing");
    assertEquals(0, refused.get());
    Received received = consume(stream, OffsetSpecification.first());
    received.await(count);
    assertEquals(List.of(bodies("m", 0, count)), received.bodies);
    assertEquals(offsets(0, count), received.offsets);
  }

  /** A 4 KiB body that says which message it is. */
  private static String big(int index) {
    String head = "big-" + index + "-";
    return head + String.valueOf((char) ('a' + index % 26)).repeat(4096 - head.length());
  }

  /**
   * Large chunks (the producer's batches of 100 messages of 4 KiB: about 400 KiB each) are sent
   * from the broker's page cache without a copy; the client checks each chunk's CRC32 (its
   * default) and the test every message's bytes and offset, from the first and from the middle.
   */
  @Test
  void largeChunksArriveWholeWithTheirChecksums() throws InterruptedException {
    String stream = declared();
    Producer producer = track(environment.producerBuilder().stream(stream).batchSize(100).build());
    int count = 2000;
    CountDownLatch confirmed = new CountDownLatch(count);
    AtomicInteger refused = new AtomicInteger();
    for (int i = 0; i < count; i++) {
      producer.send(producer.messageBuilder().addData(bytes(big(i))).build(), status -> {
        if (!status.isConfirmed()) {
          refused.incrementAndGet();
        }
        confirmed.countDown();
      });
    }
    assertTrue(confirmed.await(10, TimeUnit.SECONDS), "confirms: " + confirmed.getCount() + " missing");
    assertEquals(0, refused.get());
    for (int first : new int[] {0, 1234}) {
      Received received = consume(stream, OffsetSpecification.offset(first));
      received.await(count - first);
      assertEquals(count - first, received.bodies.size(), "messages from offset " + first);
      for (int at = 0; at < count - first; at++) {
        assertEquals(first + at, received.offsets.get(at), "offset of message " + at);
        assertEquals(big(first + at), received.bodies.get(at), "body at offset " + (first + at));
      }
    }
  }

  @Test
  void deduplicationByPublisherReference() throws InterruptedException {
    String stream = declared();
    Producer first = track(environment.producerBuilder().stream(stream).name("lepus-dedup").build());
    assertEquals(0, first.getLastPublishingId(), "last publishing id of a new reference");
    sendWithIds(first, 1, 2, 3, 4, 5);
    first.close();
    Producer again = track(environment.producerBuilder().stream(stream).name("lepus-dedup").build());
    assertEquals(5, again.getLastPublishingId());
    // 3..5 again (their confirms were lost, say): confirmed, not stored; then 6 and 7.
    sendWithIds(again, 3, 4, 5, 6, 7);
    // One publisher per reference at a time: the broker refuses a second one on the connection.
    again.close();
    assertEquals(7, track(environment.producerBuilder().stream(stream).name("lepus-dedup").build()).getLastPublishingId());
    Received received = consume(stream, OffsetSpecification.first());
    received.await(7);
    assertEquals(List.of("id-1", "id-2", "id-3", "id-4", "id-5", "id-6", "id-7"), received.bodies);
    assertEquals(offsets(0, 7), received.offsets);
  }

  private static void sendWithIds(Producer producer, long... ids) throws InterruptedException {
    CountDownLatch confirmed = new CountDownLatch(ids.length);
    for (long id : ids) {
      producer.send(producer.messageBuilder().publishingId(id).addData(bytes("id-" + id)).build(), status -> {
        assertTrue(status.isConfirmed(), "publishing id " + id + ": code " + status.getCode());
        confirmed.countDown();
      });
    }
    assertTrue(confirmed.await(10, TimeUnit.SECONDS), "confirms: " + confirmed.getCount() + " missing");
  }

  @Test
  void subscribeFromEveryOffsetKind() throws InterruptedException {
    String stream = declared();
    Producer producer = track(environment.producerBuilder().stream(stream).build());
    publishOneByOne(producer, bodies("m", 0, 5));
    Thread.sleep(1100);
    long gap = System.currentTimeMillis();
    Thread.sleep(100);
    publishOneByOne(producer, bodies("m", 5, 10));

    Received first = consume(stream, OffsetSpecification.first());
    first.await(10);
    assertEquals(List.of(bodies("m", 0, 10)), first.bodies);

    Received offset = consume(stream, OffsetSpecification.offset(6));
    offset.await(4);
    assertEquals(List.of(bodies("m", 6, 10)), offset.bodies);
    assertEquals(offsets(6, 4), offset.offsets);

    Received last = consume(stream, OffsetSpecification.last());
    last.await(1);
    assertEquals(List.of("m-9"), last.bodies);

    Received timestamp = consume(stream, OffsetSpecification.timestamp(gap));
    timestamp.await(5);
    assertEquals(List.of(bodies("m", 5, 10)), timestamp.bodies);
    assertEquals(offsets(5, 5), timestamp.offsets);

    Received next = consume(stream, OffsetSpecification.next());
    Thread.sleep(500);
    publishOneByOne(producer, "m-10");
    next.await(1);
    assertEquals(List.of("m-10"), next.bodies);
    assertEquals(List.of(10L), next.offsets);
  }

  @Test
  void severalConsumersEachReadEverything() throws InterruptedException {
    String stream = declared();
    Received early = consume(stream, OffsetSpecification.next());
    Producer producer = track(environment.producerBuilder().stream(stream).build());
    CountDownLatch confirmed = new CountDownLatch(50);
    for (String body : bodies("fan", 0, 50)) {
      producer.send(producer.messageBuilder().addData(bytes(body)).build(), status -> confirmed.countDown());
    }
    assertTrue(confirmed.await(10, TimeUnit.SECONDS));
    Received late = consume(stream, OffsetSpecification.first());
    Received later = consume(stream, OffsetSpecification.first());
    for (Received received : List.of(early, late, later)) {
      received.await(50);
      assertEquals(List.of(bodies("fan", 0, 50)), received.bodies);
      assertEquals(offsets(0, 50), received.offsets);
    }
  }

  @Test
  @Timeout(120)
  void storedOffsetsSurviveARestart() throws Exception {
    try (Broker.Restartable broker = Broker.restartable()) {
      assumeTrue(broker != null, "needs a broker to restart: LEPUS_BIN (the suite starts its own Lepus) or RABBITMQCTL");
      Environment env = Broker.environment(broker.url());
      String stream = Broker.declare(env, test);
      publishOneByOne(env.producerBuilder().stream(stream).build(), bodies("m", 0, 10));
      Consumer tracker = env.consumerBuilder().stream(stream).name("lepus-tracker").offset(OffsetSpecification.first())
          .messageHandler((context, message) -> {}).manualTrackingStrategy().builder().build();
      assertThrows(NoOffsetException.class, tracker::storedOffset);
      env.storeOffset("lepus-tracker", stream, 6);
      assertEquals(6, tracker.storedOffset());
      tracker.close();
      env.close();
      broker.restart();
      env = Broker.environment(broker.url());
      Received received = new Received();
      Consumer resumed = env.consumerBuilder().stream(stream).name("lepus-tracker").manualTrackingStrategy().builder()
          .messageHandler((context, message) -> {
            received.offsets.add(context.offset());
            received.bodies.add(new String(message.getBodyAsBinary(), StandardCharsets.UTF_8));
          }).build();
      assertEquals(6, resumed.storedOffset(), "stored offset after the restart");
      // A named consumer without an offset resumes after its stored one.
      received.await(3);
      assertEquals(List.of(bodies("m", 7, 10)), received.bodies);
      assertEquals(offsets(7, 3), received.offsets);
      // The consumer goes before its stream: deleting a stream under a named, tracking consumer
      // makes RabbitMQ's stream client unregister it on its connection thread while env.close()
      // unregisters it on this one, and the two took each other's locks (a deadlock seen against
      // RabbitMQ 3.10.8 in a CI run: jstack showed both threads in ProducersCoordinator).
      resumed.close();
      env.deleteStream(stream);
      env.close();
    }
  }

  @Test
  void refusals() {
    String missing = Broker.streamName(test) + ".missing";
    assertThrows(StreamDoesNotExistException.class, () -> environment.producerBuilder().stream(missing).build());
    assertThrows(StreamDoesNotExistException.class,
        () -> environment.consumerBuilder().stream(missing).messageHandler((context, message) -> {}).build());
    assertFalse(environment.streamExists(missing));
    String url = Broker.url();
    StreamException password = assertThrows(StreamException.class, () -> Broker.environment(url.replace("guest:guest@", "guest:wrong@")));
    assertEquals(Constants.RESPONSE_CODE_AUTHENTICATION_FAILURE, code(password), password.toString());
    StreamException vhost = assertThrows(StreamException.class, () -> Broker.environment(url.replaceAll("/[^/]*$", "/no-such-vhost")));
    // The client reports this code in its message only.
    assertTrue(vhost.getMessage().contains(Constants.RESPONSE_CODE_VIRTUAL_HOST_ACCESS_FAILURE + " (VIRTUAL_HOST_ACCESS_FAILURE)"), vhost.toString());
    assertNotNull(environment);
  }
}
