/* Intrusive lists, linked through fields the caller names (after libuv's
 * queue.h): one spelling of the few list steps that pool bins, the thread
 * caches' registry, the engine's and the stager's work queues, the
 * quarantine and UCX's request lists all take. The caller holds whatever
 * lock guards the list; a node's own links are left as they were unless
 * the step says otherwise. */
#ifndef UNIMEM_LIST_H
#define UNIMEM_LIST_H

#ifndef UM__SEES_BASE
#error "list.h: this folder may not include it (src/README.md)"
#endif

/* Append node to the singly linked queue (head, tail) through its field
 * next (which the caller has set to NULL). */
#define UM__QUEUE_APPEND(head, tail, node, next)                                                  \
  do {                                                                                            \
    if ((tail) != NULL)                                                                           \
      (tail)->next = (node);                                                                      \
    else                                                                                          \
      (head) = (node);                                                                            \
    (tail) = (node);                                                                              \
  } while (0)

/* Take the first node of a non-empty queue (head, tail) into out. */
#define UM__QUEUE_POP(head, tail, out, next)                                                      \
  do {                                                                                            \
    (out) = (head);                                                                               \
    (head) = (out)->next;                                                                         \
    if ((head) == NULL)                                                                           \
      (tail) = NULL;                                                                              \
  } while (0)

/* Unlink node from a doubly linked list that starts at head, through its
 * fields prev and next. */
#define UM__LIST_UNLINK(head, node, prev, next)                                                   \
  do {                                                                                            \
    if ((node)->prev)                                                                             \
      (node)->prev->next = (node)->next;                                                          \
    else                                                                                          \
      (head) = (node)->next;                                                                      \
    if ((node)->next)                                                                             \
      (node)->next->prev = (node)->prev;                                                          \
  } while (0)

#endif
