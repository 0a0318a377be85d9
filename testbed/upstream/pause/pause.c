/* The pause program of the real-Kubernetes test tier (testbed/upstream/build.sh links it statically): the first
 * process of every pod sandbox. It holds the pod's namespaces open, reaps the zombies the pod's processes leave to it
 * as PID 1, and exits 0 when asked to stop. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int signo) {
    (void)signo;
    _exit(0);
}

static void reap(int signo) {
    int saved = errno;
    (void)signo;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    errno = saved;
}

static int handle(int signo, void (*handler)(int)) {
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = handler;
    action.sa_flags = SA_RESTART | (signo == SIGCHLD ? SA_NOCLDSTOP : 0);
    sigemptyset(&action.sa_mask);
    return sigaction(signo, &action, NULL);
}

int main(void) {
    if (handle(SIGINT, stop) < 0 || handle(SIGTERM, stop) < 0 || handle(SIGCHLD, reap) < 0) {
        perror("pause: sigaction");
        return 1;
    }
    for (;;) {
        pause();
    }
}
