"""The one SparkSession of an sstore process, configured for a small machine.

Starting Spark costs a JVM and ~10 s, and a JVM holds exactly one SparkContext, so every Spark
user in sstore (the cast operators, the TPC-DI jobs) shares the session ``get_spark`` returns.
The PostgreSQL JDBC driver is put on its classpath at start: a jar cannot be added to a running
JVM's JDBC DriverManager reliably, so a missing jar is reported before the JVM starts.

| setting | value | why |
| --- | --- | --- |
| master | argument, else ``SSTORE_SPARK_MASTER``, else ``local[*]`` | one machine |
| ``spark.jars`` | ``SSTORE_JDBC_JAR``, else ``/usr/share/java/postgresql.jar`` | JDBC |
| ``spark.driver.memory`` | 1g | local mode runs everything in the driver; leave room |
| ``spark.sql.shuffle.partitions`` | 4 | the default 200 is for clusters; 2 cores here |
| ``spark.sql.execution.arrow.pyspark.enabled`` | true | batches cross to Python as Arrow |
| ``spark.sql.session.timeZone``, JVM zone | UTC | instants leave Spark labelled UTC, anywhere |
| ``spark.pyspark.python`` | this interpreter | Python workers need this venv's pyarrow |
| UI, console progress | off | no ports, no progress bars in logs |
| log4j | errors only | Spark's INFO/WARN chatter drowns the engine's log |
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Mapping

from sstore.base.errors import TerminalError
from sstore.base.extras import needs
from sstore.base.files import write_atomically

with needs("spark"):
    from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"
DEFAULT_JDBC_JAR = "/usr/share/java/postgresql.jar"  # Debian package libpostgresql-jdbc-java
DRIVER_MEMORY = "1g"
SHUFFLE_PARTITIONS = "4"

_LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n
"""

_lock = threading.Lock()
_session: SparkSession | None = None


class SparkSetupError(TerminalError):
    """Spark cannot start as configured (no JDBC jar, no Java, a different master running)."""


def jdbc_jar(environ: Mapping[str, str] | None = None) -> str:
    """The PostgreSQL JDBC jar to put on Spark's classpath.

    An explicit ``SSTORE_JDBC_JAR`` that points nowhere is an error, not a reason to fall back
    to the default: a silently different driver is harder to debug than a clear message.
    """
    env = os.environ if environ is None else environ
    configured = env.get("SSTORE_JDBC_JAR")
    path = configured or DEFAULT_JDBC_JAR
    if os.path.isfile(path):
        return path
    where = (f"SSTORE_JDBC_JAR={configured!r} does not exist" if configured else
             f"SSTORE_JDBC_JAR is not set and the default {DEFAULT_JDBC_JAR} does not exist")
    raise SparkSetupError(
        f"no PostgreSQL JDBC driver for Spark: {where}. Install the Debian package "
        f"libpostgresql-jdbc-java (it provides {DEFAULT_JDBC_JAR}) or set SSTORE_JDBC_JAR to "
        f"the path of a postgresql-<version>.jar")


def get_spark(master: str | None = None, app_name: str = "sstore") -> SparkSession:
    """The process's SparkSession, started on first use.

    ``master`` defaults to ``SSTORE_SPARK_MASTER``, else ``local[*]``. Asking for a different
    master than the running session's is an error (a JVM holds one SparkContext): call
    ``stop_spark()`` first.
    """
    global _session
    with _lock:
        if _session is not None and _session.sparkContext._jsc is None:
            _session = None  # stopped behind our back (spark.stop()); start afresh
        if _session is not None:
            running = _session.sparkContext.master
            if master is not None and master != running:
                raise SparkSetupError(f"Spark is already running with master {running!r}; "
                                      f"call stop_spark() before asking for {master!r}")
            return _session
        _session = _start(master or os.environ.get("SSTORE_SPARK_MASTER") or DEFAULT_MASTER,
                          app_name)
        return _session


def is_running() -> bool:
    """Whether the process's session has started (and was not stopped with ``stop_spark``):
    the planner and the calibration price Spark's start-up only when it has not, and ask this
    instead of starting a JVM to find out."""
    with _lock:
        return _session is not None


def stop_spark() -> None:
    """Stop the shared session (and its JVM's SparkContext); the next ``get_spark`` starts anew."""
    global _session
    with _lock:
        if _session is not None:
            _session.stop()
            _session = None


def _start(master: str, app_name: str) -> SparkSession:
    jar = jdbc_jar()
    if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
        raise SparkSetupError("Spark needs Java 17 or 21: install a JDK (Debian: "
                              "openjdk-17-jre-headless) or set JAVA_HOME")
    if master.startswith("local"):
        # The JVM otherwise warns about a loopback hostname and may bind to an outside address.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    java_options = f"-Duser.timezone=UTC -Dlog4j2.configurationFile=file:{_log4j2_file()}"
    spark = (SparkSession.builder.master(master).appName(app_name)
             .config("spark.jars", jar)
             .config("spark.driver.memory", DRIVER_MEMORY)
             .config("spark.driver.extraJavaOptions", java_options)
             .config("spark.executor.extraJavaOptions", java_options)
             .config("spark.sql.shuffle.partitions", SHUFFLE_PARTITIONS)
             .config("spark.sql.execution.arrow.pyspark.enabled", "true")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.pyspark.python", sys.executable)
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _log4j2_file() -> str:
    """A log4j2 configuration that keeps errors only: one file per user, replaced atomically,
    so concurrent processes never read half of it and nothing piles up in the temp directory."""
    path = os.path.join(tempfile.gettempdir(), f"sstore-spark-log4j2-{os.getuid()}.properties")
    write_atomically(path, _LOG4J2)
    return path
