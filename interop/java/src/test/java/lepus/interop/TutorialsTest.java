package lepus.interop;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.rabbitmq.client.AMQP;
import com.rabbitmq.client.BuiltinExchangeType;
import com.rabbitmq.client.Channel;
import com.rabbitmq.client.ConfirmCallback;
import com.rabbitmq.client.Connection;
import com.rabbitmq.client.ConnectionFactory;
import com.rabbitmq.client.DeliverCallback;
import com.rabbitmq.client.MessageProperties;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import java.util.UUID;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentNavigableMap;
import java.util.concurrent.ConcurrentSkipListMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;

/**
 * The seven official RabbitMQ Java tutorials (rabbitmq.com/tutorials), written the way the tutorial
 * programs are, with the program's "main" turned into a test that checks what the tutorial prints.
 * Queue and exchange names get a unique suffix so runs never collide on a shared broker.
 */
class TutorialsTest extends BrokerTest {

    private final ConnectionFactory factory = Broker.factory();

    // ---- Tutorial 1: "Hello World!" (Send.java / Recv.java) ----

    @Test
    void tutorial1HelloWorld() throws Exception {
        final String QUEUE_NAME = queueName("hello");
        BlockingQueue<String> printed = new LinkedBlockingQueue<>();

        // Recv.java
        try (Connection recvConnection = factory.newConnection(); Channel recvChannel = recvConnection.createChannel()) {
            recvChannel.queueDeclare(QUEUE_NAME, false, false, false, null);
            DeliverCallback deliverCallback = (consumerTag, delivery) -> {
                String message = new String(delivery.getBody(), StandardCharsets.UTF_8);
                printed.add(" [x] Received '" + message + "'");
            };
            recvChannel.basicConsume(QUEUE_NAME, true, deliverCallback, consumerTag -> { });

            // Send.java
            try (Connection connection = factory.newConnection(); Channel channel = connection.createChannel()) {
                channel.queueDeclare(QUEUE_NAME, false, false, false, null);
                String message = "Hello World!";
                channel.basicPublish("", QUEUE_NAME, null, message.getBytes(StandardCharsets.UTF_8));
            }

            assertEquals(" [x] Received 'Hello World!'", printed.poll(Broker.TIMEOUT_MS, TimeUnit.MILLISECONDS));
        }
    }

    // ---- Tutorial 2: Work queues (NewTask.java / Worker.java) ----

    @Test
    void tutorial2WorkQueuesDispatchFairlyWithPrefetchOneAndManualAcks() throws Exception {
        final String TASK_QUEUE_NAME = queueName("task_queue");
        Map<String, List<String>> doneBy = Collections.synchronizedMap(new HashMap<>());
        CountDownLatch allDone = new CountDownLatch(6);

        List<Connection> workers = new ArrayList<>();
        try {
            for (String worker : List.of("A", "B")) {
                // Worker.java
                final Connection connection = factory.newConnection();
                workers.add(connection);
                final Channel channel = connection.createChannel();
                channel.queueDeclare(TASK_QUEUE_NAME, true, false, false, null);
                channel.basicQos(1);
                doneBy.put(worker, Collections.synchronizedList(new ArrayList<>()));
                DeliverCallback deliverCallback = (consumerTag, delivery) -> {
                    String message = new String(delivery.getBody(), StandardCharsets.UTF_8);
                    try {
                        doWork(message);
                    } finally {
                        doneBy.get(worker).add(message);
                        channel.basicAck(delivery.getEnvelope().getDeliveryTag(), false);
                        allDone.countDown();
                    }
                };
                channel.basicConsume(TASK_QUEUE_NAME, false, deliverCallback, consumerTag -> { });
            }

            // NewTask.java: the first task is slow (dots = seconds of work in the tutorial; here 0.3 s each)
            try (Connection connection = factory.newConnection(); Channel channel = connection.createChannel()) {
                channel.queueDeclare(TASK_QUEUE_NAME, true, false, false, null);
                for (String message : List.of("slow.....", "t1.", "t2.", "t3.", "t4.", "t5.")) {
                    channel.basicPublish("", TASK_QUEUE_NAME, MessageProperties.PERSISTENT_TEXT_PLAIN,
                            message.getBytes(StandardCharsets.UTF_8));
                }
            }

            assertTrue(allDone.await(10, TimeUnit.SECONDS), "not all tasks were done: " + doneBy);
            // With basicQos(1) the worker busy with the slow task gets nothing else until it acks.
            List<String> slowWorker = doneBy.get("A").contains("slow.....") ? doneBy.get("A") : doneBy.get("B");
            List<String> other = slowWorker == doneBy.get("A") ? doneBy.get("B") : doneBy.get("A");
            assertEquals(List.of("slow....."), slowWorker);
            assertEquals(List.of("t1.", "t2.", "t3.", "t4.", "t5."), other);
        } finally {
            for (Connection c : workers) {
                closeQuietly(c);
            }
        }
        // Every task was acked: the durable queue is empty.
        assertEquals(0, ch.queueDeclarePassive(TASK_QUEUE_NAME).getMessageCount());
    }

    private static void doWork(String task) {
        for (char c : task.toCharArray()) {
            if (c == '.' && task.startsWith("slow")) {
                try {
                    Thread.sleep(300);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
            }
        }
    }

    // ---- Tutorial 3: Publish/Subscribe (EmitLog.java / ReceiveLogs.java) ----

    @Test
    void tutorial3PublishSubscribeFanoutReachesEveryReceiver() throws Exception {
        final String EXCHANGE_NAME = exchangeName("logs");
        List<BlockingQueue<String>> receivers = List.of(new LinkedBlockingQueue<>(), new LinkedBlockingQueue<>());

        try (Connection connection = factory.newConnection()) {
            for (BlockingQueue<String> printed : receivers) {
                // ReceiveLogs.java
                Channel channel = connection.createChannel();
                channel.exchangeDeclare(EXCHANGE_NAME, "fanout");
                String queueName = channel.queueDeclare().getQueue();
                channel.queueBind(queueName, EXCHANGE_NAME, "");
                DeliverCallback deliverCallback = (consumerTag, delivery) ->
                        printed.add(new String(delivery.getBody(), StandardCharsets.UTF_8));
                channel.basicConsume(queueName, true, deliverCallback, consumerTag -> { });
            }

            // EmitLog.java
            try (Connection c = factory.newConnection(); Channel channel = c.createChannel()) {
                channel.exchangeDeclare(EXCHANGE_NAME, "fanout");
                String message = "info: Hello World!";
                channel.basicPublish(EXCHANGE_NAME, "", null, message.getBytes(StandardCharsets.UTF_8));
            }

            for (BlockingQueue<String> printed : receivers) {
                assertEquals("info: Hello World!", printed.poll(Broker.TIMEOUT_MS, TimeUnit.MILLISECONDS));
            }
        }
    }

    // ---- Tutorial 4: Routing (EmitLogDirect.java / ReceiveLogsDirect.java) ----

    @Test
    void tutorial4RoutingDirectExchangeBySeverity() throws Exception {
        final String EXCHANGE_NAME = exchangeName("direct_logs");
        BlockingQueue<String> errorsOnly = new LinkedBlockingQueue<>();
        BlockingQueue<String> everything = new LinkedBlockingQueue<>();

        try (Connection connection = factory.newConnection()) {
            receiveLogsDirect(connection, EXCHANGE_NAME, List.of("error"), errorsOnly);
            receiveLogsDirect(connection, EXCHANGE_NAME, List.of("info", "warning", "error"), everything);

            // EmitLogDirect.java
            try (Connection c = factory.newConnection(); Channel channel = c.createChannel()) {
                channel.exchangeDeclare(EXCHANGE_NAME, BuiltinExchangeType.DIRECT);
                for (String severity : List.of("info", "warning", "error", "debug")) {
                    String message = severity + ": Run. Run. Or it will explode.";
                    channel.basicPublish(EXCHANGE_NAME, severity, null, message.getBytes(StandardCharsets.UTF_8));
                }
            }

            assertEquals("error:error: Run. Run. Or it will explode.", errorsOnly.poll(Broker.TIMEOUT_MS, TimeUnit.MILLISECONDS));
            for (String severity : List.of("info", "warning", "error")) {
                assertEquals(severity + ":" + severity + ": Run. Run. Or it will explode.",
                        everything.poll(Broker.TIMEOUT_MS, TimeUnit.MILLISECONDS));
            }
            // "debug" was bound by nobody; nothing else arrives.
            assertNull(errorsOnly.poll(200, TimeUnit.MILLISECONDS));
            assertNull(everything.poll(50, TimeUnit.MILLISECONDS));
        }
    }

    private static void receiveLogsDirect(Connection connection, String exchange, List<String> severities,
                                          BlockingQueue<String> printed) throws Exception {
        // ReceiveLogsDirect.java
        Channel channel = connection.createChannel();
        channel.exchangeDeclare(exchange, BuiltinExchangeType.DIRECT);
        String queueName = channel.queueDeclare().getQueue();
        for (String severity : severities) {
            channel.queueBind(queueName, exchange, severity);
        }
        DeliverCallback deliverCallback = (consumerTag, delivery) -> printed.add(
                delivery.getEnvelope().getRoutingKey() + ":" + new String(delivery.getBody(), StandardCharsets.UTF_8));
        channel.basicConsume(queueName, true, deliverCallback, consumerTag -> { });
    }

    // ---- Tutorial 5: Topics (EmitLogTopic.java / ReceiveLogsTopic.java) ----

    @Test
    void tutorial5TopicsWithStarAndHashWildcards() throws Exception {
        final String EXCHANGE_NAME = exchangeName("topic_logs");
        BlockingQueue<String> q1 = new LinkedBlockingQueue<>();
        BlockingQueue<String> q2 = new LinkedBlockingQueue<>();

        try (Connection connection = factory.newConnection()) {
            receiveLogsTopic(connection, EXCHANGE_NAME, List.of("*.orange.*"), q1);
            receiveLogsTopic(connection, EXCHANGE_NAME, List.of("*.*.rabbit", "lazy.#"), q2);

            List<String> routingKeys = List.of("quick.orange.rabbit", "lazy.orange.elephant", "quick.orange.fox",
                    "lazy.brown.fox", "lazy.pink.rabbit", "quick.brown.fox", "orange", "quick.orange.new.rabbit",
                    "lazy.orange.new.rabbit", "lazy");
            // EmitLogTopic.java
            try (Connection c = factory.newConnection(); Channel channel = c.createChannel()) {
                channel.exchangeDeclare(EXCHANGE_NAME, "topic");
                for (String routingKey : routingKeys) {
                    channel.basicPublish(EXCHANGE_NAME, routingKey, null, "msg".getBytes(StandardCharsets.UTF_8));
                }
            }

            assertEquals(List.of("quick.orange.rabbit", "lazy.orange.elephant", "quick.orange.fox"), take(q1, 3));
            assertEquals(List.of("quick.orange.rabbit", "lazy.orange.elephant", "lazy.brown.fox", "lazy.pink.rabbit",
                    "lazy.orange.new.rabbit", "lazy"), take(q2, 6));
            assertNull(q1.poll(200, TimeUnit.MILLISECONDS));
            assertNull(q2.poll(50, TimeUnit.MILLISECONDS));
        }
    }

    private static List<String> take(BlockingQueue<String> q, int n) throws InterruptedException {
        List<String> out = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            String s = q.poll(Broker.TIMEOUT_MS, TimeUnit.MILLISECONDS);
            if (s == null) {
                break;
            }
            out.add(s);
        }
        return out;
    }

    private static void receiveLogsTopic(Connection connection, String exchange, List<String> bindingKeys,
                                         BlockingQueue<String> printed) throws Exception {
        // ReceiveLogsTopic.java
        Channel channel = connection.createChannel();
        channel.exchangeDeclare(exchange, "topic");
        String queueName = channel.queueDeclare().getQueue();
        for (String bindingKey : bindingKeys) {
            channel.queueBind(queueName, exchange, bindingKey);
        }
        DeliverCallback deliverCallback = (consumerTag, delivery) -> printed.add(delivery.getEnvelope().getRoutingKey());
        channel.basicConsume(queueName, true, deliverCallback, consumerTag -> { });
    }

    // ---- Tutorial 6: RPC (RPCServer.java / RPCClient.java) ----

    @Test
    void tutorial6RpcWithReplyToCorrelationIdAndExclusiveCallbackQueue() throws Exception {
        final String RPC_QUEUE_NAME = queueName("rpc_queue");

        // RPCServer.java
        try (Connection serverConnection = factory.newConnection()) {
            Channel channel = serverConnection.createChannel();
            channel.queueDeclare(RPC_QUEUE_NAME, false, false, false, null);
            channel.queuePurge(RPC_QUEUE_NAME);
            channel.basicQos(1);
            DeliverCallback deliverCallback = (consumerTag, delivery) -> {
                AMQP.BasicProperties replyProps = new AMQP.BasicProperties.Builder()
                        .correlationId(delivery.getProperties().getCorrelationId())
                        .build();
                String response = "";
                try {
                    String message = new String(delivery.getBody(), StandardCharsets.UTF_8);
                    int n = Integer.parseInt(message);
                    response += fib(n);
                } catch (RuntimeException e) {
                    response += "error";
                } finally {
                    channel.basicPublish("", delivery.getProperties().getReplyTo(), replyProps,
                            response.getBytes(StandardCharsets.UTF_8));
                    channel.basicAck(delivery.getEnvelope().getDeliveryTag(), false);
                }
            };
            channel.basicConsume(RPC_QUEUE_NAME, false, deliverCallback, (consumerTag -> { }));

            // RPCClient.java
            try (Connection connection = factory.newConnection(); Channel clientChannel = connection.createChannel()) {
                for (int i = 0; i < 12; i++) {
                    String i_str = Integer.toString(i);
                    assertEquals(Integer.toString(fib(i)), call(clientChannel, RPC_QUEUE_NAME, i_str));
                }
                assertEquals("error", call(clientChannel, RPC_QUEUE_NAME, "not-a-number"));
            }
        }
    }

    private static String call(Channel channel, String requestQueueName, String message) throws Exception {
        final String corrId = UUID.randomUUID().toString();

        String replyQueueName = channel.queueDeclare().getQueue();
        assertTrue(replyQueueName.startsWith("amq.gen-"), replyQueueName);
        AMQP.BasicProperties props = new AMQP.BasicProperties.Builder()
                .correlationId(corrId)
                .replyTo(replyQueueName)
                .build();

        channel.basicPublish("", requestQueueName, props, message.getBytes(StandardCharsets.UTF_8));

        final CompletableFuture<String> response = new CompletableFuture<>();

        String ctag = channel.basicConsume(replyQueueName, true, (consumerTag, delivery) -> {
            if (delivery.getProperties().getCorrelationId().equals(corrId)) {
                response.complete(new String(delivery.getBody(), StandardCharsets.UTF_8));
            }
        }, consumerTag -> { });

        String result = response.get(Broker.TIMEOUT_MS, TimeUnit.MILLISECONDS);
        channel.basicCancel(ctag);
        return result;
    }

    private static int fib(int n) {
        if (n == 0) return 0;
        if (n == 1) return 1;
        return fib(n - 1) + fib(n - 2);
    }

    // ---- Tutorial 7: Publisher confirms (PublisherConfirms.java) ----

    private static final int MESSAGE_COUNT = 1_000;

    @Test
    void tutorial7PublishMessagesIndividually() throws Exception {
        String queue = queueName("confirms-individual");
        try (Connection connection = factory.newConnection()) {
            Channel channel = connection.createChannel();
            channel.queueDeclare(queue, false, false, true, null);
            channel.confirmSelect();
            for (int i = 0; i < 200; i++) {
                String body = String.valueOf(i);
                channel.basicPublish("", queue, null, body.getBytes());
                channel.waitForConfirmsOrDie(5_000);
            }
            assertEquals(200, channel.queueDeclarePassive(queue).getMessageCount());
        }
    }

    @Test
    void tutorial7PublishMessagesInBatch() throws Exception {
        String queue = queueName("confirms-batch");
        try (Connection connection = factory.newConnection()) {
            Channel ch = connection.createChannel();
            ch.queueDeclare(queue, false, false, true, null);
            ch.confirmSelect();

            int batchSize = 100;
            int outstandingMessageCount = 0;
            for (int i = 0; i < MESSAGE_COUNT + 50; i++) {
                String body = String.valueOf(i);
                ch.basicPublish("", queue, null, body.getBytes());
                outstandingMessageCount++;
                if (outstandingMessageCount == batchSize) {
                    ch.waitForConfirmsOrDie(5_000);
                    outstandingMessageCount = 0;
                }
            }
            if (outstandingMessageCount > 0) {
                ch.waitForConfirmsOrDie(5_000);
            }
            assertEquals(MESSAGE_COUNT + 50, ch.queueDeclarePassive(queue).getMessageCount());
        }
    }

    @Test
    void tutorial7HandlePublishConfirmsAsynchronously() throws Exception {
        String queue = queueName("confirms-async");
        try (Connection connection = factory.newConnection()) {
            Channel ch = connection.createChannel();
            ch.queueDeclare(queue, false, false, true, null);
            ch.confirmSelect();

            ConcurrentNavigableMap<Long, String> outstandingConfirms = new ConcurrentSkipListMap<>();
            Set<Long> confirmedSeqNos = Collections.synchronizedSet(new TreeSet<>());
            AtomicInteger nacks = new AtomicInteger();

            ConfirmCallback cleanOutstandingConfirms = (sequenceNumber, multiple) -> {
                if (multiple) {
                    ConcurrentNavigableMap<Long, String> confirmed = outstandingConfirms.headMap(sequenceNumber, true);
                    confirmedSeqNos.addAll(confirmed.keySet());
                    confirmed.clear();
                } else {
                    confirmedSeqNos.add(sequenceNumber);
                    outstandingConfirms.remove(sequenceNumber);
                }
            };

            ch.addConfirmListener(cleanOutstandingConfirms, (sequenceNumber, multiple) -> {
                nacks.incrementAndGet();
                cleanOutstandingConfirms.handle(sequenceNumber, multiple);
            });

            assertEquals(1, ch.getNextPublishSeqNo(), "publish sequence numbers start at 1");
            for (int i = 0; i < MESSAGE_COUNT; i++) {
                String body = String.valueOf(i);
                outstandingConfirms.put(ch.getNextPublishSeqNo(), body);
                ch.basicPublish("", queue, null, body.getBytes());
            }

            long deadline = System.currentTimeMillis() + 10_000;
            while (!outstandingConfirms.isEmpty() && System.currentTimeMillis() < deadline) {
                Thread.sleep(10);
            }
            assertTrue(outstandingConfirms.isEmpty(), "unconfirmed: " + outstandingConfirms.size());
            assertEquals(0, nacks.get(), "no message may be nacked");
            assertEquals(MESSAGE_COUNT, confirmedSeqNos.size());
            TreeSet<Long> seqNos = new TreeSet<>(confirmedSeqNos);
            assertEquals(1L, seqNos.first());
            assertEquals((long) MESSAGE_COUNT, seqNos.last());
            assertEquals(MESSAGE_COUNT, ch.queueDeclarePassive(queue).getMessageCount());
        }
    }
}
