// Hadoop's local file system, setting the modes of the files and folders it creates through
// java.nio instead of a `chmod` process per file (see lake_assets/jvm_classes.py for why).
package lake_assets.hadoop;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;

public class NioPermissionsLocalFileSystem extends RawLocalFileSystem {
  /** The permission each mode bit grants, lowest bit first (as `chmod` reads an octal mode). */
  private static final PosixFilePermission[] BY_BIT = {
    PosixFilePermission.OTHERS_EXECUTE, PosixFilePermission.OTHERS_WRITE, PosixFilePermission.OTHERS_READ,
    PosixFilePermission.GROUP_EXECUTE, PosixFilePermission.GROUP_WRITE, PosixFilePermission.GROUP_READ,
    PosixFilePermission.OWNER_EXECUTE, PosixFilePermission.OWNER_WRITE, PosixFilePermission.OWNER_READ,
  };

  @Override
  public void setPermission(Path path, FsPermission permission) throws IOException {
    short mode = permission.toShort();
    if ((mode & ~0777) != 0) { // a sticky bit: java.nio cannot set it, Hadoop's own way can
      super.setPermission(path, permission);
      return;
    }
    Set<PosixFilePermission> granted = EnumSet.noneOf(PosixFilePermission.class);
    for (int bit = 0; bit < BY_BIT.length; bit++) {
      if ((mode & (1 << bit)) != 0) {
        granted.add(BY_BIT[bit]);
      }
    }
    try {
      Files.setPosixFilePermissions(pathToFile(path).toPath(), granted);
    } catch (UnsupportedOperationException notPosix) {
      super.setPermission(path, permission);
    }
  }
}
