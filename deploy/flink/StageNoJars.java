package specrag.flink;

import java.io.File;
import java.net.URISyntaxException;
import java.util.Collections;
import org.apache.beam.sdk.util.construction.resources.PipelineResourcesDetector;

/**
 * Beam's Flink job server ships every jar of its own classpath (161 jars, 158 MB) with each job:
 * Flink uploads them to its blob server and each TaskManager fetches them, 13-15 s a job on two
 * cores. The cluster of deploy/flink/launch.py starts its TaskManagers from that same classpath
 * with parent-first class loading, so a job needs none of them. A job names this detector with
 * --pipeline_resources_detector_factory_class (launch.py flags does) and ships only this class's
 * own 2 KB jar: Beam's Kafka expansion service, which reads the same options to list a
 * transform's dependencies, refuses an empty list (its Java worker pool holds those jars too).
 * A cluster without Beam's runner on its TaskManagers' classpath must not use it.
 */
public class StageNoJars implements PipelineResourcesDetector.Factory {
  /** Beam's options build the factory through this method. */
  public static StageNoJars create() {
    return new StageNoJars();
  }

  @Override
  public PipelineResourcesDetector getPipelineResourcesDetector() {
    return classLoader -> Collections.singletonList(ownJar());
  }

  private static String ownJar() {
    try {
      return new File(StageNoJars.class.getProtectionDomain().getCodeSource().getLocation().toURI())
          .getAbsolutePath();
    } catch (URISyntaxException e) {
      throw new IllegalStateException("StageNoJars: its own jar has no file path", e);
    }
  }
}
