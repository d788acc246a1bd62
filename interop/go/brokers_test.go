package interop

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// lepusStartTimeout bounds how long a private Lepus broker may take to accept connections.
const lepusStartTimeout = 10 * time.Second

// brokerProduct is the `product` server property of the broker under test ("RabbitMQ", "Lepus").
func brokerProduct(t *testing.T) string {
	t.Helper()
	conn := dial(t)
	product, _ := conn.Properties["product"].(string)
	_ = conn.Close()
	return product
}

// rabbitmqctl runs $RABBITMQCTL (a command prefix such as "rabbitmqctl -n node@localhost")
// with args, failing the test if it is unset or fails.
func rabbitmqctl(t *testing.T, args ...string) string {
	t.Helper()
	prefix := strings.Fields(os.Getenv("RABBITMQCTL"))
	if len(prefix) == 0 {
		t.Fatalf("the broker is RabbitMQ: set RABBITMQCTL (e.g. 'rabbitmqctl -n node@localhost') for this test")
	}
	out, err := exec.Command(prefix[0], append(prefix[1:], args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", strings.Join(prefix, " "), strings.Join(args, " "), err, out)
	}
	return string(out)
}

// freePort asks the kernel for a free TCP port on the loopback interface.
func freePort(t *testing.T) int {
	t.Helper()
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	defer listener.Close()
	return listener.Addr().(*net.TCPAddr).Port
}

// startLepus starts a private `$LEPUS_BIN server` with the extra environment, stopped when the
// test ends, and returns its AMQP URL (with the credentials of AMQP_URL).
func startLepus(t *testing.T, environment ...string) string {
	t.Helper()
	binary := os.Getenv("LEPUS_BIN")
	if binary == "" {
		t.Fatalf("the broker is Lepus: set LEPUS_BIN so this test can start a broker of its own")
	}
	directory := t.TempDir()
	port := freePort(t)
	command := exec.Command(binary, "server", "--data-dir", filepath.Join(directory, "data"),
		"--amqp-port", fmt.Sprint(port), "--bind", "127.0.0.1", "--http-port", "0", "--metrics-port", "0",
		"--stream-port", "0")
	command.Env = append(os.Environ(), environment...)
	logFile, err := os.Create(filepath.Join(directory, "lepus.log"))
	if err != nil {
		t.Fatalf("log file: %v", err)
	}
	command.Stdout, command.Stderr = logFile, logFile
	if err := command.Start(); err != nil {
		t.Fatalf("start %s: %v", binary, err)
	}
	t.Cleanup(func() {
		_ = command.Process.Kill()
		_ = command.Wait()
		_ = logFile.Close()
	})
	deadline := time.Now().Add(lepusStartTimeout)
	for {
		connection, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
		if err == nil {
			_ = connection.Close()
			break
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(directory, "lepus.log"))
			t.Fatalf("lepus did not listen on %d within %s:\n%s", port, lepusStartTimeout, log)
		}
		time.Sleep(50 * time.Millisecond)
	}
	uri := parsedURI(t)
	return amqp.URI{Scheme: "amqp", Host: "127.0.0.1", Port: port, Username: uri.Username,
		Password: uri.Password, Vhost: "/"}.String()
}

// withMemoryAlarm gives a broker whose memory alarm is raised: it returns the URL and a function
// that clears the alarm, or nil where that cannot be done at run time. RabbitMQ: the node's
// watermark goes to 0 through rabbitmqctl (restored when the test ends). Lepus: a private broker
// starts with a 1-byte watermark (the disk-alarm test in the Python suite covers clearing there).
func withMemoryAlarm(t *testing.T) (string, func()) {
	t.Helper()
	if brokerProduct(t) == "Lepus" {
		return startLepus(t, "LEPUS_MEMORY_HIGH_WATERMARK_BYTES=1"), nil
	}
	watermark := strings.TrimSpace(rabbitmqctl(t, "eval", "vm_memory_monitor:get_vm_memory_high_watermark()."))
	if strings.Trim(watermark, "0123456789.") != "" {
		t.Fatalf("unexpected memory watermark %q", watermark)
	}
	rabbitmqctl(t, "set_vm_memory_high_watermark", "0")
	cleared := false
	clear := func() {
		if !cleared {
			cleared = true
			rabbitmqctl(t, "set_vm_memory_high_watermark", watermark)
		}
	}
	t.Cleanup(clear)
	return amqpURL(), clear
}
