/*
 * nettest: the guest side of vmm's network integration tests. Static, no libc beyond
 * what glibc's static build needs; it runs in guest user mode, which is native speed even on
 * hosts that emulate guest kernel code, so only its system calls cost emulation time.
 *
 *   nettest echo PORT COUNT TIMEOUT_S
 *       Receive COUNT UDP datagrams on PORT, check every byte of each against the pattern
 *       below, and send each back to its sender. Prints one line:
 *       "nettest: echo received=N bad=M sizes=a,b,c" and exits 0 when all were good.
 *   nettest tcp PORT BYTES
 *       Accept one TCP connection on PORT, read BYTES checking each against the stream pattern
 *       below, then write BYTES of the pattern back and close. Prints
 *       "nettest: tcp received=N bad=M sent=K"; exits 0 when all were good.
 *   nettest send HOST PORT COUNT SIZE[,SIZE...]
 *       Send COUNT datagrams to HOST:PORT, cycling through the sizes, with the pattern below.
 *
 * Pattern of datagram number `seq` of `size` bytes (size >= 8): bytes 0..3 = seq (LE),
 * bytes 4..7 = size (LE), byte i >= 8 = (seq * 31 + i) & 0xff.
 * TCP stream pattern: byte i = (i * 7 + i / 251) & 0xff.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#define MAX_DGRAM 65507

static unsigned char buf[MAX_DGRAM];

static void fill(unsigned char *p, uint32_t seq, uint32_t size)
{
	memcpy(p, &seq, 4);
	memcpy(p + 4, &size, 4);
	for (uint32_t i = 8; i < size; i++)
		p[i] = (unsigned char)(seq * 31 + i);
}

static int check(const unsigned char *p, size_t len)
{
	uint32_t seq, size;
	if (len < 8)
		return 0;
	memcpy(&seq, p, 4);
	memcpy(&size, p + 4, 4);
	if (size != len)
		return 0;
	for (uint32_t i = 8; i < size; i++)
		if (p[i] != (unsigned char)(seq * 31 + i))
			return 0;
	return 1;
}

static int do_echo(int port, long count, int timeout_s)
{
	int fd = socket(AF_INET, SOCK_DGRAM, 0);
	if (fd < 0) {
		perror("nettest: socket");
		return 2;
	}
	int rcvbuf = 4 << 20;
	setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
	struct timeval tv = { .tv_sec = timeout_s };
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	struct sockaddr_in addr = { .sin_family = AF_INET, .sin_port = htons(port) };
	if (bind(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0) {
		perror("nettest: bind");
		return 2;
	}
	printf("nettest: listening on %d\n", port);
	fflush(stdout);
	long received = 0, bad = 0;
	ssize_t sizes[8];
	int nsizes = 0;
	while (received < count) {
		struct sockaddr_in from;
		socklen_t fromlen = sizeof(from);
		ssize_t n = recvfrom(fd, buf, sizeof(buf), 0, (struct sockaddr *)&from, &fromlen);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			perror("nettest: recvfrom");
			break;
		}
		received++;
		if (!check(buf, (size_t)n)) {
			bad++;
			continue;
		}
		int seen = 0;
		for (int i = 0; i < nsizes; i++)
			seen |= sizes[i] == n;
		if (!seen && nsizes < 8)
			sizes[nsizes++] = n;
		if (sendto(fd, buf, (size_t)n, 0, (struct sockaddr *)&from, fromlen) != n) {
			perror("nettest: sendto");
			bad++;
		}
	}
	printf("nettest: echo received=%ld bad=%ld sizes=", received, bad);
	for (int i = 0; i < nsizes; i++)
		printf(i ? ",%zd" : "%zd", sizes[i]);
	printf("\n");
	return (received == count && bad == 0) ? 0 : 1;
}

static int do_send(const char *host, int port, long count, char *sizelist)
{
	uint32_t sizes[16];
	int nsizes = 0;
	for (char *tok = strtok(sizelist, ","); tok && nsizes < 16; tok = strtok(NULL, ",")) {
		long s = atol(tok);
		if (s < 8 || s > MAX_DGRAM) {
			fprintf(stderr, "nettest: bad size %s\n", tok);
			return 2;
		}
		sizes[nsizes++] = (uint32_t)s;
	}
	if (!nsizes)
		return 2;
	int fd = socket(AF_INET, SOCK_DGRAM, 0);
	struct sockaddr_in addr = { .sin_family = AF_INET, .sin_port = htons(port) };
	if (fd < 0 || inet_pton(AF_INET, host, &addr.sin_addr) != 1) {
		fprintf(stderr, "nettest: bad host %s\n", host);
		return 2;
	}
	for (long seq = 0; seq < count; seq++) {
		uint32_t size = sizes[seq % nsizes];
		fill(buf, (uint32_t)seq, size);
		while (sendto(fd, buf, size, 0, (struct sockaddr *)&addr, sizeof(addr)) < 0) {
			if (errno != ENOBUFS && errno != EAGAIN) {
				perror("nettest: sendto");
				return 1;
			}
			usleep(1000);
		}
	}
	printf("nettest: sent=%ld\n", count);
	return 0;
}

/* TCP pattern: byte i of a stream = (i * 7 + i / 251) & 0xff. */
static unsigned char tcp_byte(unsigned long i)
{
	return (unsigned char)(i * 7 + i / 251);
}

static int do_tcp(int port, unsigned long bytes)
{
	int lfd = socket(AF_INET, SOCK_STREAM, 0);
	int one = 1;
	setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	struct sockaddr_in addr = { .sin_family = AF_INET, .sin_port = htons(port) };
	if (lfd < 0 || bind(lfd, (struct sockaddr *)&addr, sizeof(addr)) < 0 || listen(lfd, 1) < 0) {
		perror("nettest: tcp listen");
		return 2;
	}
	printf("nettest: tcp listening on %d\n", port);
	int fd = accept(lfd, NULL, NULL);
	if (fd < 0) {
		perror("nettest: accept");
		return 2;
	}
	unsigned long got = 0, bad = 0;
	while (got < bytes) {
		ssize_t n = read(fd, buf, sizeof(buf));
		if (n <= 0) {
			if (n < 0 && errno == EINTR)
				continue;
			break;
		}
		for (ssize_t i = 0; i < n; i++)
			bad += buf[i] != tcp_byte(got + (unsigned long)i);
		got += (unsigned long)n;
	}
	unsigned long sent = 0;
	while (sent < bytes) {
		size_t chunk = bytes - sent < sizeof(buf) ? bytes - sent : sizeof(buf);
		for (size_t i = 0; i < chunk; i++)
			buf[i] = tcp_byte(sent + i);
		ssize_t n = write(fd, buf, chunk);
		if (n <= 0) {
			if (n < 0 && errno == EINTR)
				continue;
			perror("nettest: tcp write");
			break;
		}
		sent += (unsigned long)n;
	}
	shutdown(fd, SHUT_WR);
	while (read(fd, buf, sizeof(buf)) > 0)
		;
	close(fd);
	printf("nettest: tcp received=%lu bad=%lu sent=%lu\n", got, bad, sent);
	return (got == bytes && bad == 0 && sent == bytes) ? 0 : 1;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 5 && !strcmp(argv[1], "echo"))
		return do_echo(atoi(argv[2]), atol(argv[3]), atoi(argv[4]));
	if (argc == 4 && !strcmp(argv[1], "tcp"))
		return do_tcp(atoi(argv[2]), strtoul(argv[3], NULL, 10));
	if (argc == 6 && !strcmp(argv[1], "send"))
		return do_send(argv[2], atoi(argv[3]), atol(argv[4]), argv[5]);
	fprintf(stderr, "usage: nettest echo PORT COUNT TIMEOUT_S | send HOST PORT COUNT SIZES | tcp PORT BYTES\n");
	return 2;
}
