"""Running code that may crash or hang in a child process: the message channel
(:mod:`.channel`) and the child process itself (:mod:`.child`). Used by the conformance
workers and by the probe of third-party plugins; imports nothing heavy, so a child starts
with little more than ``prism_core`` itself."""
