/*
 * conn_watch.c — the whole-request deadline: every open connection is watched from MHD's STARTED
 * notice to its CLOSED notice, and one that does not deliver its request within request_timeout_s
 * is shut down (watch_sweep, from the main loop).
 */
#include "server/server_impl.h"

/* MHD's connection notices: register a connection when it opens (waiting for its first request),
 * forget it when it closes (MHD closes the socket only after this returns). */
void notify_conn(void *cls, struct MHD_Connection *c, void **socket_context, enum MHD_ConnectionNotificationCode code) {
    server *S = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        cwatch *w = calloc(1, sizeof *w);
        if (!w || !ci) {
            free(w);
            *socket_context = NULL;
            return;
        }
        w->fd = ci->connect_fd;
        w->t_wait = now_s();
        w->receiving = 1;
        pthread_mutex_lock(&S->watch_mu);
        w->next = S->watch;
        if (S->watch) S->watch->prev = w;
        S->watch = w;
        pthread_mutex_unlock(&S->watch_mu);
        *socket_context = w;
    } else if (*socket_context) {
        cwatch *w = *socket_context;
        pthread_mutex_lock(&S->watch_mu);
        if (w->prev) w->prev->next = w->next;
        else S->watch = w->next;
        if (w->next) w->next->prev = w->prev;
        pthread_mutex_unlock(&S->watch_mu);
        free(w);
        *socket_context = NULL;
    }
}

/* The request on connection c has arrived whole: its deadline stops counting. */
void watch_arrived(server *S, struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    if (!ci || !ci->socket_context) return;
    pthread_mutex_lock(&S->watch_mu);
    ((cwatch *)ci->socket_context)->receiving = 0;
    pthread_mutex_unlock(&S->watch_mu);
}

/* Shut down every connection that has waited longer than request_timeout_s for a whole request
 * (headers and body): a client trickling bytes keeps MHD's idle timeout from ever firing, so this
 * deadline is what frees its connection and thread. Called from the main loop. */
void watch_sweep(server *S) {
    double t = now_s();
    pthread_mutex_lock(&S->watch_mu);
    for (cwatch *w = S->watch; w; w = w->next)
        if (w->receiving && !w->cut && t - w->t_wait > S->o.request_timeout_s) {
            shutdown(w->fd, SHUT_RDWR);
            w->cut = 1;
            S->n_req_timeouts++;
        }
    pthread_mutex_unlock(&S->watch_mu);
}
