/*
 * The C-client reference of the protocol bench (benches/protocol.rs): the
 * same Redis commands as the Rust bench's cases, sent by hiredis from a
 * plain blocking loop, so that the Rust client's cost is a measured
 * difference in one run instead of a figure from another day.
 *
 *   reference <port> <mode> <millis | N"t"> <begin.lua> <commit.lua> <client>
 *
 * mode: ping  (two PINGs, the floor of two round trips)
 *       baton (begin.lua + GET payload, then PSETEX staged + commit.lua:
 *              the arguments RedisStore sends, with a record of the size
 *              it writes)
 *       naive (SET NX, HGET, HGET, Lua CAS, GET, DEL: the article's turn)
 *
 * Runs whole turns for <millis> (or exactly N turns, for instruction counts
 * under valgrind) on one connection, then prints the elapsed
 * nanoseconds on the first line and one turn's latency (ns) per line.
 * Any unexpected reply aborts with a message: a reference that silently
 * did less work would flatter itself.
 */
#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#define STATE_BYTES 4096

static const char *NAIVE_CAS =
    "if tonumber(redis.call('HGET', KEYS[1], 'version') or '0') == tonumber(ARGV[1]) then\n"
    "  redis.call('HSET', KEYS[1], 'version', ARGV[1] + 1, 'payload', ARGV[2])\n"
    "  return 1\n"
    "end\n"
    "return 0";

static void die(const char *what, redisReply *r) {
    fprintf(stderr, "reference: %s: %s\n", what,
            r == NULL ? "no reply" : (r->str != NULL ? r->str : "unexpected reply"));
    exit(1);
}

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static long long wall_ms(void) {
    struct timeval t;
    gettimeofday(&t, NULL);
    return (long long)t.tv_sec * 1000LL + t.tv_usec / 1000;
}

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) { perror(path); exit(1); }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)n + 1);
    if (fread(text, 1, (size_t)n, f) != (size_t)n) { perror(path); exit(1); }
    text[n] = 0;
    fclose(f);
    return text;
}

static char *load(redisContext *c, const char *source) {
    redisReply *r = redisCommand(c, "SCRIPT LOAD %s", source);
    if (r == NULL || r->type != REDIS_REPLY_STRING) die("SCRIPT LOAD", r);
    char *sha = strdup(r->str);
    freeReplyObject(r);
    return sha;
}

/* Sends argc/argv as one command into the pipeline. */
static void append(redisContext *c, int argc, const char **argv) {
    size_t lens[24];
    for (int i = 0; i < argc; i++) lens[i] = strlen(argv[i]);
    redisAppendCommandArgv(c, argc, argv, lens);
}

static redisReply *next(redisContext *c) {
    void *r = NULL;
    if (redisGetReply(c, &r) != REDIS_OK) die("connection", NULL);
    return r;
}

static void ping_turn(redisContext *c) {
    for (int i = 0; i < 2; i++) {
        redisReply *r = redisCommand(c, "PING");
        if (r == NULL || r->type != REDIS_REPLY_STATUS) die("PING", r);
        freeReplyObject(r);
    }
}

struct session {
    char state[96], payload[96], log[96], staged_prefix[96], known[96], lease[96], owner[64];
};

static void baton_turn(redisContext *c, const struct session *s, const char *begin_sha,
                       const char *commit_sha, const char *state) {
    /* Round trip 1: begin.lua (ARGV as RedisStore::begin_once sends them)
     * and the payload's GET. */
    const char *begin[] = {"EVALSHA", begin_sha, "3", s->state, s->payload, s->known, s->owner,
                           "", "", "30000", "3600000", "", "", "create", "", "", ""};
    append(c, 17, begin);
    const char *get[] = {"GET", s->payload};
    append(c, 2, get);
    redisReply *granted = next(c);
    redisReply *payload = next(c);
    if (granted->type != REDIS_REPLY_ARRAY || granted->elements < 5 ||
        strcmp(granted->element[0]->str, "GRANTED") != 0)
        die("begin", granted);
    long long fence = granted->element[1]->integer;
    long long seq = granted->element[2]->integer;
    long long version = granted->element[3]->integer;
    if (version > 0 && (payload->type != REDIS_REPLY_STRING || payload->len != STATE_BYTES))
        die("payload", payload);
    freeReplyObject(granted);
    freeReplyObject(payload);

    /* Round trip 2: stage the payload, commit.lua with what
     * RedisStore::commit computes (versions, the idempotency record, a turn
     * record of the same shape and size, times). */
    char staged[128], fence_s[24], expected[24], new_version[24], result[48], seq_s[24],
        slot[24], digest_slot[24], digest[48], now_s[24], record[640];
    long long now = wall_ms();
    snprintf(staged, sizeof staged, "%s%lld", s->staged_prefix, fence);
    snprintf(fence_s, sizeof fence_s, "%lld", fence);
    snprintf(expected, sizeof expected, "%lld", version);
    snprintf(new_version, sizeof new_version, "%lld", version + 1);
    snprintf(result, sizeof result, "%lld\n%lld\nok", seq, version + 1);
    snprintf(seq_s, sizeof seq_s, "%lld", seq);
    snprintf(slot, sizeof slot, "i%lld", seq % 1024);
    snprintf(digest_slot, sizeof digest_slot, "d%lld", seq % 1024);
    snprintf(digest, sizeof digest, "%lld:", seq);
    snprintf(now_s, sizeof now_s, "%lld", now);
    snprintf(record, sizeof record,
             "{\"tenant\":\"bench\",\"session\":\"c-ref\",\"turn_seq\":%lld,\"version\":%lld,"
             "\"replica\":\"%s\",\"fence\":%lld,\"input_digest\":\"\",\"reply_digest\":"
             "\"2689367b205c16ce32ed4200942b8b8b1e262dfc70d9bc9fbc77c49699a4f1df\","
             "\"workspace\":null,\"started_at_ms\":0,\"committed_at_ms\":%lld}",
             seq, version + 1, s->owner, fence, now);
    size_t lens[16];
    const char *psetex[] = {"PSETEX", staged, "3660000", state};
    for (int i = 0; i < 3; i++) lens[i] = strlen(psetex[i]);
    lens[3] = STATE_BYTES;
    redisAppendCommandArgv(c, 4, psetex, lens);
    const char *commit[] = {"EVALSHA", commit_sha, "5", s->state, s->log, s->payload, staged,
                            s->known, fence_s, expected, new_version, "", result, "3600000",
                            record, slot, now_s, seq_s, "604800000", "", digest_slot, digest};
    append(c, 22, commit);
    redisReply *ok = next(c);
    redisReply *committed = next(c);
    if (ok->type != REDIS_REPLY_STATUS) die("PSETEX", ok);
    if (committed->type != REDIS_REPLY_ARRAY || strcmp(committed->element[0]->str, "COMMITTED") != 0)
        die("commit", committed);
    freeReplyObject(ok);
    freeReplyObject(committed);
}

static void naive_turn(redisContext *c, const struct session *s, const char *cas_sha,
                       const char *state) {
    redisReply *r = redisCommand(c, "SET %s %s NX PX 30000", s->lease, s->owner);
    if (r == NULL || r->type != REDIS_REPLY_STATUS) die("SET NX", r);
    freeReplyObject(r);
    r = redisCommand(c, "HGET %s version", s->state);
    long long version = (r != NULL && r->type == REDIS_REPLY_STRING) ? atoll(r->str) : 0;
    freeReplyObject(r);
    r = redisCommand(c, "HGET %s payload", s->state);
    freeReplyObject(r);
    r = redisCommand(c, "EVALSHA %s 1 %s %lld %b", cas_sha, s->state, version, state,
                     (size_t)STATE_BYTES);
    if (r == NULL || r->type != REDIS_REPLY_INTEGER || r->integer != 1) die("CAS", r);
    freeReplyObject(r);
    r = redisCommand(c, "GET %s", s->lease);
    int mine = r != NULL && r->type == REDIS_REPLY_STRING && strcmp(r->str, s->owner) == 0;
    freeReplyObject(r);
    if (mine) freeReplyObject(redisCommand(c, "DEL %s", s->lease));
}

int main(int argc, char **argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: reference <port> <ping|baton|naive> <millis> <begin.lua> <commit.lua> <client>\n");
        return 2;
    }
    const char *mode = argv[2];
    size_t limit = argv[3][strlen(argv[3]) - 1] == 't' ? (size_t)atoll(argv[3]) : (size_t)-1;
    long long until = limit != (size_t)-1 ? (1LL << 62) : now_ns() + atoll(argv[3]) * 1000000LL;
    redisContext *c = redisConnect("127.0.0.1", atoi(argv[1]));
    if (c == NULL || c->err) { fprintf(stderr, "reference: connect failed\n"); return 1; }

    struct session s;
    const char *client = argv[6];
    snprintf(s.owner, sizeof s.owner, "c-ref-%s", client);
    if (strcmp(mode, "naive") == 0) {
        snprintf(s.state, sizeof s.state, "cnaive:{%s}:state", client);
        snprintf(s.lease, sizeof s.lease, "cnaive:{%s}:lease", client);
    } else {
        snprintf(s.state, sizeof s.state, "baton:{bench:c-ref-%s}:state", client);
        snprintf(s.payload, sizeof s.payload, "baton:{bench:c-ref-%s}:payload", client);
        snprintf(s.log, sizeof s.log, "baton:{bench:c-ref-%s}:log", client);
        snprintf(s.staged_prefix, sizeof s.staged_prefix, "baton:{bench:c-ref-%s}:staged:", client);
        snprintf(s.known, sizeof s.known, "baton:{bench:c-ref-%s}:known", client);
    }
    char *state = malloc(STATE_BYTES + 1);
    memset(state, 's', STATE_BYTES);
    state[STATE_BYTES] = 0;
    char *begin_sha = load(c, read_file(argv[4]));
    char *commit_sha = load(c, read_file(argv[5]));
    char *cas_sha = load(c, NAIVE_CAS);

    size_t cap = 1 << 16, n = 0;
    long long *latencies = malloc(cap * sizeof *latencies);
    long long started = now_ns(), t = started;
    while (t < until && n < limit) {
        if (strcmp(mode, "ping") == 0) ping_turn(c);
        else if (strcmp(mode, "baton") == 0) baton_turn(c, &s, begin_sha, commit_sha, state);
        else if (strcmp(mode, "naive") == 0) naive_turn(c, &s, cas_sha, state);
        else { fprintf(stderr, "reference: unknown mode %s\n", mode); return 2; }
        long long done = now_ns();
        if (n == cap) latencies = realloc(latencies, (cap *= 2) * sizeof *latencies);
        latencies[n++] = done - t;
        t = done;
    }
    printf("%lld\n", t - started);
    for (size_t i = 0; i < n; i++) printf("%lld\n", latencies[i]);
    redisFree(c);
    return 0;
}
