/* Raw libzmq baseline for `make bench-bus`: a ROUTER echo server and a DEALER client, the same
 * shapes the bus uses (two frames, a ~200-byte body), over tcp loopback in two processes.
 *   zmq_echo server ENDPOINT
 *   zmq_echo client ENDPOINT SECONDS   -> prints "latency_us=X throughput_rps=Y"
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int serve(const char *endpoint) {
    void *ctx = zmq_ctx_new();
    void *router = zmq_socket(ctx, ZMQ_ROUTER);
    if (zmq_bind(router, endpoint) != 0) { perror("zmq_bind"); return 1; }
    zmq_msg_t parts[3];
    for (;;) {
        int count = 0, more = 1;
        while (more && count < 3) {
            zmq_msg_init(&parts[count]);
            if (zmq_msg_recv(&parts[count], router, 0) < 0) return 1;
            more = zmq_msg_more(&parts[count]);
            count++;
        }
        for (int i = 0; i < count; i++) {
            zmq_msg_send(&parts[i], router, i < count - 1 ? ZMQ_SNDMORE : 0);
        }
    }
}

/* Diagnostic variant: a ROUTER that answers in the bus's reply format (so a Swift BusClient can
 * be measured alone against a C server). A message is one request or a batch of them (header and
 * body frames in pairs, at most 64); a batch is answered in one message, as the bus server does. */
#define MAX_BATCH 64
static int serve_bus(const char *endpoint) {
    void *ctx = zmq_ctx_new();
    void *router = zmq_socket(ctx, ZMQ_ROUTER);
    if (zmq_bind(router, endpoint) != 0) { perror("zmq_bind"); return 1; }
    zmq_msg_t parts[1 + 2 * MAX_BATCH], overflow;
    for (;;) {
        int count = 0, more = 1;
        while (more) {
            /* Frames past the limit are read into a scratch message and dropped. */
            zmq_msg_t *part = count < 1 + 2 * MAX_BATCH ? &parts[count] : &overflow;
            zmq_msg_init(part);
            if (zmq_msg_recv(part, router, 0) < 0) return 1;
            more = zmq_msg_more(part);
            if (part == &overflow) zmq_msg_close(part);
            count++;
        }
        int valid = count >= 3 && count <= 1 + 2 * MAX_BATCH && count % 2 == 1;
        for (int i = 1; valid && i < count; i += 2) if (zmq_msg_size(&parts[i]) < 11) valid = 0;
        if (!valid) { for (int i = 0; i < count && i < 1 + 2 * MAX_BATCH; i++) zmq_msg_close(&parts[i]); continue; }
        zmq_msg_send(&parts[0], router, ZMQ_SNDMORE);
        for (int i = 1; i < count; i += 2) {
            /* version, kind, encoding, request id: the request's, with kind 1 (reply) */
            unsigned char reply[11];
            memcpy(reply, zmq_msg_data(&parts[i]), 11);
            reply[1] = 1;
            zmq_send(router, reply, 11, ZMQ_SNDMORE);
            zmq_msg_close(&parts[i]);
            zmq_msg_send(&parts[i + 1], router, i + 2 < count ? ZMQ_SNDMORE : 0);
        }
    }
}

static void send_request(void *dealer, const char *header, size_t header_len, const char *body, size_t body_len) {
    zmq_send(dealer, header, header_len, ZMQ_SNDMORE);
    zmq_send(dealer, body, body_len, 0);
}

static void receive_reply(void *dealer) {
    char buffer[1024];
    int more = 1;
    while (more) {
        zmq_recv(dealer, buffer, sizeof buffer, 0);
        size_t size = sizeof more;
        zmq_getsockopt(dealer, ZMQ_RCVMORE, &more, &size);
    }
}

static int client(const char *endpoint, double seconds) {
    void *ctx = zmq_ctx_new();
    void *dealer = zmq_socket(ctx, ZMQ_DEALER);
    if (zmq_connect(dealer, endpoint) != 0) { perror("zmq_connect"); return 1; }
    const char header[40] = "\x01\x00request-header-of-the-same-size";
    char body[200];
    memset(body, 'x', sizeof body);

    for (int i = 0; i < 2000; i++) { send_request(dealer, header, sizeof header, body, sizeof body); receive_reply(dealer); }

    long latency_count = 0;
    double start = now_seconds();
    while (now_seconds() - start < seconds) {
        send_request(dealer, header, sizeof header, body, sizeof body);
        receive_reply(dealer);
        latency_count++;
    }
    double latency_us = (now_seconds() - start) * 1e6 / latency_count;

    const int in_flight = 64;
    long completed = 0;
    for (int i = 0; i < in_flight; i++) send_request(dealer, header, sizeof header, body, sizeof body);
    start = now_seconds();
    while (now_seconds() - start < seconds) {
        receive_reply(dealer);
        completed++;
        send_request(dealer, header, sizeof header, body, sizeof body);
    }
    double elapsed = now_seconds() - start;
    for (int i = 0; i < in_flight; i++) receive_reply(dealer);
    printf("latency_us=%.2f throughput_rps=%.0f\n", latency_us, completed / elapsed);
    zmq_close(dealer);
    zmq_ctx_term(ctx);
    return 0;
}

/* Diagnostic variant: a DEALER that speaks the bus's request format, so a Swift BusServer can be
 * measured alone against a C client. The body is JSON, or the bytes given in hex as a binary
 * body (`bus-bench body -` prints the sample's). */
static int client_bus(const char *endpoint, double seconds, const char *hex) {
    void *ctx = zmq_ctx_new();
    void *dealer = zmq_socket(ctx, ZMQ_DEALER);
    if (zmq_connect(dealer, endpoint) != 0) { perror("zmq_connect"); return 1; }
    const char *body = "{\"userId\":\"device:2b7f4c1e-8a53-4f0e-9d55-0c6c1c1a9e77\",\"jobId\":\"4f1c2d9e-6b7a-4c3e-8f21-9a0b1c2d3e4f\","
        "\"effectId\":\"auto-enhance\",\"prompt\":\"brighten the sky a little\",\"cost\":1,\"parameters\":{\"sigma\":1.5,\"factor\":2}}";
    static char binary[1024];
    unsigned char encoding = 0; /* JSON */
    if (hex && strlen(hex) / 2 < sizeof binary) {
        size_t length = strlen(hex) / 2;
        for (size_t i = 0; i < length; i++) { unsigned int byte; sscanf(hex + 2 * i, "%2x", &byte); binary[i] = (char)byte; }
        binary[length] = 0;
        body = binary;
        encoding = 1;
    }
    size_t body_len = encoding ? strlen(hex) / 2 : strlen(body);
    unsigned char header[64];
    size_t n = 0;
    header[n++] = 2; header[n++] = 0; header[n++] = encoding;
    unsigned long long id = 1;
    memcpy(header + n, &id, 8); n += 8;
    long long deadline = (long long)time(NULL) * 1000 + 3600 * 1000;
    memcpy(header + n, &deadline, 8); n += 8;
    header[n++] = 10; memcpy(header + n, "bench.echo", 10); n += 10;
    header[n++] = 0;
    for (int i = 0; i < 2000; i++) { send_request(dealer, (char *)header, n, body, body_len); receive_reply(dealer); }
    long latency_count = 0;
    double start = now_seconds();
    while (now_seconds() - start < seconds) {
        send_request(dealer, (char *)header, n, body, body_len);
        receive_reply(dealer);
        latency_count++;
    }
    double latency_us = (now_seconds() - start) * 1e6 / latency_count;
    long completed = 0;
    for (int i = 0; i < 64; i++) send_request(dealer, (char *)header, n, body, body_len);
    start = now_seconds();
    while (now_seconds() - start < seconds) {
        receive_reply(dealer);
        completed++;
        send_request(dealer, (char *)header, n, body, body_len);
    }
    double elapsed = now_seconds() - start;
    for (int i = 0; i < 64; i++) receive_reply(dealer);
    printf("latency_us=%.2f throughput_rps=%.0f\n", latency_us, completed / elapsed);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 3 && strcmp(argv[1], "server") == 0) return serve(argv[2]);
    if (argc >= 3 && strcmp(argv[1], "busserver") == 0) return serve_bus(argv[2]);
    if (argc >= 4 && strcmp(argv[1], "client") == 0) return client(argv[2], atof(argv[3]));
    if (argc >= 4 && strcmp(argv[1], "busclient") == 0) return client_bus(argv[2], atof(argv[3]), argc >= 5 ? argv[4] : NULL);
    fprintf(stderr, "usage: zmq_echo server ENDPOINT | client ENDPOINT SECONDS\n");
    return 2;
}
